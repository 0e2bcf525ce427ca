"""What models are made from and measured on: the corpus's text (``corpus``), the corpus spoken
by espeak-ng (``speech``) and the rewrites that make questions noisy (``augment``).

Training, export (calibration, the accuracy gates) and the benchmarks all read them, so they
live below all three: none of them reaches into another for its inputs.
"""
