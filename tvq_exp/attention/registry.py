"""The backends by name: ``build_attention(name, **options)`` (Hydra's ``_target_`` for every
``model/attention`` preset) and :data:`BACKENDS`. A new backend is one line here (see CONTRIBUTING.md)."""

from __future__ import annotations

from typing import Any

from tvq_exp.attention.base import AttentionBackend
from tvq_exp.attention.dense import DenseAttention
from tvq_exp.attention.flash_chunk import FlashChunkAttention
from tvq_exp.attention.linear import LinearAttention
from tvq_exp.attention.ovq.layer import OVQAttention
from tvq_exp.attention.vq.layer import VQAttention
from tvq_exp.options import OptionError

BACKENDS: dict[str, type[AttentionBackend]] = {
    "dense": DenseAttention,
    "vq": VQAttention,
    "linear": LinearAttention,
    "flash_chunk": FlashChunkAttention,
    "ovq": OVQAttention,
}
TALKING_HEADS_BACKENDS = ("dense",)


def build_attention(name: str, **options: Any) -> AttentionBackend:
    """Build the attention backend called ``name`` with its keyword ``options``.

    Example: ``build_attention("vq", d_k=128, d_v=256, heads=1, codebook_size=512, block_len=512)``.
    """
    if name not in BACKENDS:
        raise OptionError(
            "name", name, f"unknown attention backend; choose one of {', '.join(sorted(BACKENDS))}"
        )
    talking = [key for key in ("talking_heads", "talking_heads_post") if options.get(key)]
    if talking and name not in TALKING_HEADS_BACKENDS:
        raise OptionError(
            talking[0], True, f"the {name} backend cannot mix logits across heads (talking heads need the full "
            f"T×T logits, which only {', '.join(TALKING_HEADS_BACKENDS)} materialises); use model/attention=dense "
            "or turn them off",
            BACKENDS[name],
        )  # fmt: skip
    if name not in TALKING_HEADS_BACKENDS:  # switched off: drop the (false) flags the backend does not know
        options = {key: value for key, value in options.items() if not key.startswith("talking_heads")}
    return BACKENDS[name](**options)


__all__ = ["BACKENDS", "TALKING_HEADS_BACKENDS", "build_attention"]
