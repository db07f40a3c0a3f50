"""Plain reference of linear attention: a token loop (causal) or one full matrix (encoder). Written for
clarity, not speed; :class:`~tvq_exp.attention.linear.LinearAttention` is tested against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.base import repeat_kv


def linear_attention(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Linear attention by a token loop (causal) or one full matrix (encoder): ``(B, H, T, d_v)``."""
    fq = attn.features(q, query=True)
    fk = repeat_kv(attn.features(k, query=False), q.shape[1])
    vv = repeat_kv(v, q.shape[1]).to(fk.dtype)
    if not attn.causal:
        a = fq @ fk.transpose(-1, -2)
        return ((a @ vv) / (a.sum(-1, keepdim=True) + attn.eps)).to(v.dtype)
    s = fk.new_zeros(*fk.shape[:2], fk.shape[-1], vv.shape[-1])
    z = fk.new_zeros(*fk.shape[:2], fk.shape[-1])
    outs = []
    for t in range(q.shape[2]):
        s = s + fk[:, :, t, :, None] * vv[:, :, t, None, :]
        z = z + fk[:, :, t]
        num = (fq[:, :, t, :, None] * s).sum(-2)
        den = (fq[:, :, t] * z).sum(-1, keepdim=True)
        outs.append(num / (den + attn.eps))
    return torch.stack(outs, dim=2).to(v.dtype)
