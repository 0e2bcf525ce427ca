"""Load tests: perf_analyzer runs and LLM metrics (time to first token, inter-token latency)."""
