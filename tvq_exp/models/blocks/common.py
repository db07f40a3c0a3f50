"""What every block shares: attention construction, positions and the carried state layout."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tvq_exp.attention.base import AttentionBackend, State, with_position_bias
from tvq_exp.nn.position import apply_rope

AttentionFactory = Callable[..., AttentionBackend]
POSITIONS = ("xl", "rope", "none")


@dataclass(eq=False)
class BlockState(State):
    """A block's carried state: its ``position``, its attention's state ``attn`` and the LayerDrop mask ``keep``
    (``(B,)`` or None), which holds for the whole sequence."""

    attn: State
    keep: Tensor | None = None


def build_block_attention(
    attention: AttentionFactory,
    position: str,
    d_k: int,
    d_v: int,
    heads: int,
    sinusoid_dim: int,
    sinusoid_dropout: float = 0.0,
    **extra: Any,
) -> AttentionBackend:
    """Call the attention factory; with ``position == 'xl'`` build the XL relative bias over the backend's window
    (its sinusoids ``sinusoid_dim`` wide, the blocks pass ``d_model`` as the official code, with
    ``sinusoid_dropout``) and hand it over. A backend without the bias is refused then, with the reason."""
    attn = attention(d_k=d_k, d_v=d_v, heads=heads, **extra)
    return with_position_bias(attn, sinusoid_dim, sinusoid_dropout) if position == "xl" else attn


def rotate(q: Tensor, k: Tensor, t0: int, position: str) -> tuple[Tensor, Tensor]:
    """Apply RoPE at absolute positions ``t0..t0+T-1`` when ``position == 'rope'``."""
    if position != "rope":
        return q, k
    pos = t0 + torch.arange(q.shape[2], device=q.device)
    return apply_rope(q, pos), apply_rope(k, pos)
