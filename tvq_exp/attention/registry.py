"""The backends by name: ``build_attention(name, **options)`` (Hydra's ``_target_`` for every
``model/attention`` preset) and :data:`BACKENDS`. A new backend is one line here (see CONTRIBUTING.md)."""

from __future__ import annotations

from typing import Any

from tvq_exp.attention.base import POSITION_BIAS_ARGUMENTS, TALKING_HEADS_ARGUMENTS, AttentionBackend
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

    What the backend's class does not support is refused with the reason when asked for (talking heads, the
    XL position bias) and dropped when switched off, so a block passes the same arguments to every backend.

    Example: ``build_attention("vq", d_k=128, d_v=256, heads=1, codebook_size=512, block_len=512)``.
    """
    if name not in BACKENDS:
        raise OptionError(
            "name", name, f"unknown attention backend; choose one of {', '.join(sorted(BACKENDS))}"
        )
    backend = BACKENDS[name]
    talking = [key for key in TALKING_HEADS_ARGUMENTS if options.get(key)]
    if talking and not backend.supports_talking_heads:
        able = ", ".join(n for n, b in BACKENDS.items() if b.supports_talking_heads)
        raise OptionError(
            talking[0], True, f"the {name} backend cannot mix logits across heads (talking heads need the full "
            f"T×T logits, which only {able} materialises); use model/attention={able} or turn them off",
            backend,
        )  # fmt: skip
    if options.get("window_bias") and not backend.supports_position_bias:
        raise OptionError(
            "position", "xl", f"the {name} backend has no relative position bias; use position=rope or "
            "position=none", backend,
        )  # fmt: skip
    unsupported = (() if backend.supports_talking_heads else TALKING_HEADS_ARGUMENTS) + (
        () if backend.supports_position_bias else tuple(POSITION_BIAS_ARGUMENTS)
    )
    return backend(**{key: value for key, value in options.items() if key not in unsupported})


__all__ = ["BACKENDS", "build_attention"]
