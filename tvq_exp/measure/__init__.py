"""Measuring the code: matmul FLOP counting, timing and memory (no other tvq_exp import)."""
