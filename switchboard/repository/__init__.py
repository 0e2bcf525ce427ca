"""The Triton model repository, owned in one place and importable without Triton.

What each model's ``config.pbtxt`` says and how a model reads it (``params``, ``config``), how
the repository is rendered for a target (``render``), and which files of an export go into a
model's version folder (``install``). The Triton glue reads its config from here; export and
ops install through it.
"""
