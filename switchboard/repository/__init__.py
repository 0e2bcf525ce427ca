"""The Triton model repository, owned in one place and importable without Triton.

Its models by name and the pools' sizes (``models``), what each model's ``config.pbtxt`` says
and how a model reads it (``params``, ``config``), how the repository is rendered for a target
(``render``), which files of an export go into a model's version folder (``install``), and
which versions serve (``versions``: the pools' ``version_policy``, ``chat``'s stable and canary
versions). The Triton glue reads its config from here; ``export`` installs what it built
through it, and ``ops`` rolls versions out with it.
"""
