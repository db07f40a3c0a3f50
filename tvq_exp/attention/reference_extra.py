"""Plain references for the linear, FLASH, FLASH-Quad / talking-heads and encoder VQ backends.

Written for clarity, not speed: explicit token loops or full ``T×T`` matrices, entry by entry where
a position rule is involved. Each takes the backend module only for its parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import repeat_kv
from tvq_exp.nn.position import XLRelativeBias


def linear_reference(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
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


def signed_rel(rel_bias: XLRelativeBias, d: int) -> Tensor:
    """``r_d = W_r·sinusoid(d)`` for one signed integer distance ``d``: ``(H, d_k)``.

    ``sinusoid(-d) = (-sin(d·ω), cos(d·ω))``, read from the module's table of ``|d|``."""
    row = rel_bias.table[abs(d)].clone()
    if d < 0:
        row[: row.shape[0] // 2] *= -1
    return rel_bias.proj(row.to(rel_bias.proj.weight.dtype)).view(rel_bias.heads, rel_bias.d_k)


def window_bias_matrix(rel_bias: XLRelativeBias, q: Tensor, causal: bool) -> Tensor:
    """Dense ``(B, H, T, T)`` XL bias, entry by entry: ``(q_i + v)·r_{i-j}`` for ``0 <= i-j <= M``
    (causal) or ``|i - j| <= M`` (encoder), zero elsewhere."""
    b, h, t, _ = q.shape
    m = rel_bias.max_distance
    rel = {d: signed_rel(rel_bias, d).to(q.dtype) for d in range(-m, m + 1)}
    qv = q + rel_bias.v.to(q.dtype)[None, :, None, :]
    out = q.new_zeros(b, h, t, t)
    for i in range(t):
        for j in range(t):
            d = i - j
            if abs(d) <= m and (d >= 0 or not causal):
                out[:, :, i, j] = (qv[:, :, i] * rel[d][None]).sum(-1)
    return out


def _logits(attn, q: Tensor, k: Tensor) -> Tensor:
    """``(q [+ u])·kᵀ [+ bias]`` with full matrices, ``k`` already expanded to all heads."""
    if attn.bias is None:
        return q @ k.transpose(-1, -2)
    return attn.bias.content_query(q) @ k.transpose(-1, -2) + window_bias_matrix(attn.bias, q, attn.causal)


def dense_reference(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~tvq_exp.attention.dense.DenseAttention` with any ``score`` and talking heads, from
    full matrices: mix logits, mask, softmax or ``relu²/(keys visible)``, mix weights, times ``v``."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    t = q.shape[2]
    logits = _logits(attn, q, k)
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


def flash_chunk_reference(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """FLASH mixed chunk attention from full ``T×T`` matrices: group masks by position, quadratic
    scores inside the group, ``q·k`` over earlier (encoder: other) groups, per-position normaliser."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    t = q.shape[2]
    group = torch.arange(t, device=q.device) // attn.group_size
    same = group[:, None] == group[None, :]
    quad = same & torch.ones_like(same).tril() if attn.causal else same
    lin = group[None, :] < group[:, None] if attn.causal else ~same
    lin_term = (q @ k.transpose(-1, -2)) * lin
    logits = _logits(attn, q, k)

    def divisor(n: Tensor) -> Tensor | float:
        return n.clamp_min(1) if attn.norm == "count" else attn.norm_scale

    if attn.score == "relu2":
        n = quad.sum(-1, keepdim=True) + lin.sum(-1, keepdim=True)
        return (F.relu(logits).square() * quad + lin_term) @ v / divisor(n)
    a = torch.softmax(logits.masked_fill(~quad, float("-inf")), dim=-1)
    return a @ v + lin_term @ v / divisor(lin.sum(-1, keepdim=True))


def vq_window_reference(attn, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~tvq_exp.attention.vq.VQAttention` (causal or encoder) as one dense softmax over the
    quantised keys: content query ``q + u``, XL bias at ``|i - j| <= M`` (causal: ``0 <= i - j``).
    Keys carry their straight-through gradient only where their block is within one block of the
    query's (the exact window), values only there unless ``grad_through_cache``; ``use_cache=False``
    masks everything else."""
    k_hat, _, _ = attn.quantizer(k)
    k_hat, v = repeat_kv(k_hat, q.shape[1]), repeat_kv(v, q.shape[1])
    t = q.shape[2]
    block = torch.arange(t, device=q.device) // attn.block_len
    near = (block[:, None] - block[None, :]).abs() <= 1
    qc = q if attn.bias is None else attn.bias.content_query(q)
    logits = torch.where(near, qc @ k_hat.transpose(-1, -2), qc @ k_hat.detach().transpose(-1, -2))
    if attn.bias is not None:
        logits = logits + window_bias_matrix(attn.bias, q, attn.causal)
    visible = near if not attn.use_cache else torch.ones_like(near)
    if attn.causal:
        visible = visible & torch.ones_like(near).tril()
    a = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    far_v = v if attn.grad_through_cache else v.detach()
    return (a * near) @ v + (a * ~near) @ far_v
