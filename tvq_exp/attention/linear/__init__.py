"""Kernelised linear attention: :mod:`.layer` (the backend), :mod:`.naive` (the plain reference)."""

from tvq_exp.attention.linear.layer import LinearAttention

__all__ = ["LinearAttention"]
