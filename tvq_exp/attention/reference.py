"""Plain reference implementations the efficient backends are tested against.

Written for clarity, not speed: full ``T×T`` matrices or explicit token loops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.base import repeat_kv
from tvq_exp.nn.position import XLRelativeBias


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, bias: Tensor | None = None) -> Tensor:
    """``softmax(q·kᵀ + bias + mask)·v`` with full matrices: ``(B, H, T, d_v)``."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    logits = q @ k.transpose(-1, -2)
    if bias is not None:
        logits = logits + bias
    if causal:
        t_q, t_k = q.shape[2], k.shape[2]
        mask = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q)
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def xl_bias_matrix(rel_bias: XLRelativeBias, q: Tensor) -> Tensor:
    """Dense ``(B, H, T, T)`` XL bias, entry by entry: ``(q_i + v)·r_{i-j}`` for ``0 <= i-j <= M``."""
    b, h, t, _ = q.shape
    rel = rel_bias.rel().to(q.dtype)  # (H, M+1, d_k)
    qv = q + rel_bias.v.to(q.dtype)[None, :, None, :]
    out = q.new_zeros(b, h, t, t)
    for i in range(t):
        for j in range(max(0, i - rel_bias.max_distance), i + 1):
            out[:, :, i, j] = (qv[:, :, i] * rel[None, :, i - j]).sum(-1)
    return out


def vq_reference(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """What :class:`~tvq_exp.attention.vq.VQAttention` must equal: dense causal softmax over the
    quantised keys (straight-through), content query ``q + u`` and the bias clipped at the window."""
    k_hat, _, _ = attn.quantizer(k)
    if attn.bias is None:
        return softmax_attention(q, k_hat, v)
    return softmax_attention(attn.bias.content_query(q), k_hat, v, bias=xl_bias_matrix(attn.bias, q))
