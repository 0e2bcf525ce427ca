"""Trainers: models made by training on the corpus.

- ``chat``: the embedded default chat model, a small Llama trained from scratch
  (``python -m switchboard.training.chat``);
- ``asr``: the embedded speech recognizer, a small Whisper trained from scratch on the corpus
  spoken by espeak-ng (``python -m switchboard.training.asr``);
- ``gemma``: Gemma 3 270M fine-tuned into the agent (``python -m switchboard.training.gemma``).

Their commands change a setting with ``--set KEY=VALUE`` (``settings``). What they read is in
``switchboard.data``; a build is skipped when its inputs are unchanged (``switchboard.stamp``).
"""
