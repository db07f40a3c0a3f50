"""Attention backends behind one contract (see :mod:`tvq_exp.attention.base`).

``build_attention(name, **options)`` builds any backend by name: ``dense``, ``vq``.
"""

from __future__ import annotations

from typing import Any

from tvq_exp.attention.base import AttentionBackend, Aux, State
from tvq_exp.attention.dense import DenseAttention
from tvq_exp.attention.vq import VQAttention

BACKENDS: dict[str, type[AttentionBackend]] = {"dense": DenseAttention, "vq": VQAttention}


def build_attention(name: str, **options: Any) -> AttentionBackend:
    """Build the attention backend called ``name`` with its keyword ``options``.

    Example: ``build_attention("vq", d_k=128, d_v=256, heads=1, codebook_size=512, block_len=512)``.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](**options)


__all__ = ["AttentionBackend", "Aux", "BACKENDS", "DenseAttention", "State", "VQAttention", "build_attention"]
