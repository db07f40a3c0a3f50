"""Kernelised linear attention: :mod:`.layer` (the backend), :mod:`.naive` (the plain reference)."""

from tvq_exp.attention.linear.layer import LinearAttention, LinearState

__all__ = ["LinearAttention", "LinearState"]
