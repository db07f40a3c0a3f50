"""Plain references of dense attention (and the XL bias every windowed backend shares): full ``T×T``
matrices, entry by entry where a position rule is involved. Written for clarity, not speed; each takes the
backend module only for its parameters. :class:`~tvq_exp.attention.dense.DenseAttention` is tested against
them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import repeat_kv
from tvq_exp.nn.position import XLRelativeBias


def softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = True, bias: Tensor | None = None
) -> Tensor:
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


def window_bias_matrix(rel_bias: XLRelativeBias, q: Tensor, causal: bool) -> Tensor:
    """Dense ``(B, H, T, T)`` XL bias, entry by entry: ``(q_i + v)·r_{i-j}`` for ``0 <= i-j <= M``
    (causal) or ``|i - j| <= M`` (encoder), zero elsewhere."""
    b, h, t, _ = q.shape
    m = rel_bias.max_distance
    signed = rel_bias.signed_rel().to(q.dtype)  # (H, 2M + 1, d_k)
    rel = {d: signed[:, d + m] for d in range(-m, m + 1)}
    qv = rel_bias.position_query(q)
    out = q.new_zeros(b, h, t, t)
    for i in range(t):
        for j in range(t):
            d = i - j
            if abs(d) <= m and (d >= 0 or not causal):
                out[:, :, i, j] = (qv[:, :, i] * rel[d][None]).sum(-1)
    return out


def explicit_logits(attn, q: Tensor, k: Tensor) -> Tensor:
    """``(q [+ u])·kᵀ [+ bias]`` with full matrices, ``k`` already expanded to all heads."""
    if attn.bias is None:
        return q @ k.transpose(-1, -2)
    return attn.bias.content_query(q) @ k.transpose(-1, -2) + window_bias_matrix(attn.bias, q, attn.causal)


def dense_attention(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~tvq_exp.attention.dense.DenseAttention` with any ``score`` and talking heads, from
    full matrices: mix logits, mask, softmax or ``relu²/(keys visible)``, mix weights, times ``v``."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    t = q.shape[2]
    logits = explicit_logits(attn, q, k)
    if attn.mix_pre is not None:
        logits = torch.einsum("hg,bgij->bhij", attn.mix_pre.to(q.dtype), logits)
    visible = torch.ones(t, t, dtype=torch.bool, device=q.device)
    if attn.causal:
        visible = visible.tril()
    if attn.score == "softmax":
        weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    else:
        weights = F.relu(logits).square() * visible / visible.sum(-1, keepdim=True)
    if attn.mix_post is not None:
        weights = torch.einsum("hg,bgij->bhij", attn.mix_post.to(q.dtype), weights)
    return weights @ v
