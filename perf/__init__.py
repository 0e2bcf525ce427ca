"""Switchboard's benchmark suite: load generators, peers, workloads and reports. Not part of
the wheel: it runs from the repository's root (``python -m perf <suite>``; ``python -m perf
--help`` lists the suites) and imports the product as any client would; the product imports
nothing from it."""
