"""What models are made from and measured on: the corpus's text and conversations
(``corpus``), the JSON extraction conversations built from it (``extraction``), the corpus
spoken by espeak-ng (``speech``) and the rewrites that make questions noisy (``augment``).

Training, export (calibration, the accuracy gates), evaluation and the benchmarks all read
them, so they live below all of these: none reaches into another for its inputs.
"""
