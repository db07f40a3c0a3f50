"""The backends by name: ``build_attention(name, **options)`` (Hydra's ``_target_`` for every
``model/attention`` preset) and :data:`BACKENDS`. A new backend is one line here (see CONTRIBUTING.md)."""

from __future__ import annotations

from typing import Any

from tvq_exp.attention.base import TALKING_HEADS_ARGUMENTS, AttentionBackend
from tvq_exp.attention.dense import DenseAttention
from tvq_exp.attention.flash_chunk import FlashChunkAttention
from tvq_exp.attention.linear import LinearAttention
from tvq_exp.attention.ovq import OVQAttention
from tvq_exp.attention.vq import VQAttention
from tvq_exp.options import OptionError

BACKENDS: dict[str, type[AttentionBackend]] = {
    "dense": DenseAttention,
    "vq": VQAttention,
    "linear": LinearAttention,
    "flash_chunk": FlashChunkAttention,
    "ovq": OVQAttention,
}


def build_attention(name: str, **options: Any) -> AttentionBackend:
    """Build the attention backend called ``name`` with its keyword ``options``.

    Talking heads are refused with the reason when asked of a backend whose class cannot mix heads, and dropped
    when switched off, so a preset may name them for every backend. (The XL relative bias is not an option: a
    block builds it and hands it over, :meth:`~tvq_exp.attention.base.AttentionBackend.use_position_bias`.)

    Example: ``build_attention("vq", d_k=128, d_v=256, heads=1, codebook_size=512, block_len=512)``.
    """
    if name not in BACKENDS:
        raise OptionError(
            "name", name, f"unknown attention backend; choose one of {', '.join(sorted(BACKENDS))}"
        )
    backend = BACKENDS[name]
    if backend.supports_talking_heads:
        return backend(**options)
    talking = [key for key in TALKING_HEADS_ARGUMENTS if options.get(key)]
    if talking:
        able = ", ".join(n for n, b in BACKENDS.items() if b.supports_talking_heads)
        raise OptionError(
            talking[0], True, f"the {name} backend cannot mix logits across heads (talking heads need the full "
            f"T×T logits, which only {able} materialises); use model/attention={able} or turn them off",
            backend,
        )  # fmt: skip
    return backend(**{key: value for key, value in options.items() if key not in TALKING_HEADS_ARGUMENTS})


__all__ = ["BACKENDS", "build_attention"]
