"""Attention and model benchmarks (``python -m tvq_exp.bench``): see :mod:`.cli`."""
