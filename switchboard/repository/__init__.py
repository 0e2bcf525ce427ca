"""The Triton model repository, owned in one place and importable without Triton.

What each model's ``config.pbtxt`` says and how a model reads it (``params``, ``config``).
The Triton glue reads its config from here; the renderer and the tools write it.
"""
