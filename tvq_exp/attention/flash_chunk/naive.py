"""Plain reference of FLASH mixed chunk attention from full ``T×T`` matrices. Written for clarity, not
speed; :class:`~tvq_exp.attention.flash_chunk.FlashChunkAttention` is tested against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import repeat_kv
from tvq_exp.attention.dense.naive import explicit_logits


def flash_chunk_attention(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """FLASH mixed chunk attention from full ``T×T`` matrices: group masks by position, quadratic
    scores inside the group, ``q·k`` over earlier (encoder: other) groups, per-position normaliser."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    t = q.shape[2]
    group = torch.arange(t, device=q.device) // attn.group_size
    same = group[:, None] == group[None, :]
    quad = same & torch.ones_like(same).tril() if attn.causal else same
    lin = group[None, :] < group[:, None] if attn.causal else ~same
    lin_term = (q @ k.transpose(-1, -2)) * lin
    logits = explicit_logits(attn, q, k)

    def divisor(n: Tensor) -> Tensor | float:
        return n.clamp_min(1) if attn.norm == "count" else attn.norm_scale

    if attn.score == "relu2":
        n = quad.sum(-1, keepdim=True) + lin.sum(-1, keepdim=True)
        return (F.relu(logits).square() * quad + lin_term) @ v / divisor(n)
    a = torch.softmax(logits.masked_fill(~quad, float("-inf")), dim=-1)
    return a @ v + lin_term @ v / divisor(lin.sum(-1, keepdim=True))
