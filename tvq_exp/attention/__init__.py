"""Attention backends behind one contract (:mod:`tvq_exp.attention.base`).

``build_attention(name, **options)`` builds any backend by name (:mod:`.registry`): ``dense``, ``vq``
(:mod:`.vq`), ``linear``, ``flash_chunk``, ``ovq`` (:mod:`.ovq`). Each efficient algorithm has a plain
reference in a ``naive`` module beside it (:mod:`.naive`, :mod:`.vq.naive`, :mod:`.ovq.naive`).
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
