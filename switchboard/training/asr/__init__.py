"""The embedded default speech recognizer, trained from the repository alone.

``python -m switchboard.training.asr --out build/asr-default-model`` speaks the corpus with
espeak-ng (``switchboard.data.speech``), trains a tiny Whisper-architecture model on it and
writes a Hugging Face Whisper directory that the export and serving code load like any other
Whisper checkpoint, plus ``asr_report.json`` with its error rates on held-out questions.

- ``tokenizer``: a byte-level BPE vocabulary from the corpus with Whisper's special tokens;
- ``data``: what is spoken (sentences and word sequences), synthesized in parallel, cached;
- ``model``: the configuration, the variable-length encoder, training and greedy decoding;
- ``evaluate``: word and character error rates in a training voice and in an unseen one.
"""
