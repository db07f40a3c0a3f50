"""Attention backends behind one contract (:mod:`tvq_exp.attention.base`).

``build_attention(name, **options)`` builds any backend by name (:mod:`.registry`). One folder per mixer,
each with its backend (``layer.py``), its plain reference (``naive.py``) and, where it has one, its
flex-attention kernel (``flex.py``): :mod:`.dense`, :mod:`.linear`, :mod:`.flash_chunk`, :mod:`.vq`,
:mod:`.ovq`. Backend-free pieces: :mod:`.base` (the contract), :mod:`.flex_runtime`, :mod:`.registry`.
"""

from tvq_exp.attention.base import AttentionBackend, Aux, State
from tvq_exp.attention.dense import DenseAttention
from tvq_exp.attention.flash_chunk import FlashChunkAttention
from tvq_exp.attention.linear import LinearAttention
from tvq_exp.attention.ovq import OVQAttention
from tvq_exp.attention.registry import BACKENDS, build_attention
from tvq_exp.attention.vq import VQAttention

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "Aux",
    "DenseAttention",
    "FlashChunkAttention",
    "LinearAttention",
    "OVQAttention",
    "State",
    "VQAttention",
    "build_attention",
]
