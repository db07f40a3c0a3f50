"""Bidirectional (encoder) Transformer-VQ attention and the two-sided window bias of every encoder.

With quantised keys ``k̂_j = C[z_j]`` and no bias, encoder softmax attention collapses onto the
codebook: ``softmax(q·k̂ᵀ)v = exp(qCᵀ)(ΔᵀV) / exp(qCᵀ)(Δᵀ1)`` with ``Δ (T, S)`` the one-hot codes,
an ``O(T·S)`` computation. The window bias (``|i - j| <= M``) is handled exactly by splitting the
keys of query ``i`` (in block ``r`` of ``L >= M`` positions) into
- an exact window, blocks ``r-1, r, r+1``: quantised keys, bias at distances ``|i - j| <= M``;
- a cache over all other blocks: per code the count ``n_s`` and mean value ``μ_s`` of blocks
  ``0..r-2`` (exclusive prefix) merged with those of blocks ``r+2..`` (exclusive suffix), scored
  ``(q_i + u)·C_s + log n_s``.
Prefix and suffix are built as running means, so nothing is subtracted and nothing cancels. Cost
per layer ``O(T·(3L + S)·(d_k + d_v))``. Gradients follow the causal backend: keys receive their
(straight-through) gradient inside the window, the codebook none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import Aux, State, accumulation_dtype
from tvq_exp.nn.position import XLRelativeBias

if TYPE_CHECKING:
    from tvq_exp.attention.vq import VQAttention


def signed_relative_embeddings(rel_bias: XLRelativeBias) -> Tensor:
    """Projected sinusoids of the signed distances ``-M..M``: ``(H, 2M + 1, d_k)``.

    ``sinusoid(-d)`` is ``sinusoid(d)`` with its sine half negated (sine is odd, cosine even).
    """
    table = rel_bias.table
    half = table.shape[1] // 2
    negative = torch.cat([-table[1:, :half], table[1:, half:]], dim=1).flip(0)
    full = torch.cat([negative, table], dim=0).to(rel_bias.proj.weight.dtype)
    rel = rel_bias.proj(full)
    return rel.view(full.shape[0], rel_bias.heads, rel_bias.d_k).transpose(0, 1)


def encoder_bias(rel_bias: XLRelativeBias, q: Tensor, distance: Tensor, rel: Tensor | None = None) -> Tensor:
    """Two-sided XL bias ``(q_i + v)·r_{i-j}`` for ``|i - j| <= M`` (zero beyond).

    ``q (B, H, ..., Tq, d_k)``, ``distance (Tq, Tk)`` (query minus key position) ->
    ``(B, H, ..., Tq, Tk)``. Equals :meth:`XLRelativeBias.bias` wherever ``distance >= 0``.
    ``rel``: :func:`signed_relative_embeddings`, if already computed.
    """
    m = rel_bias.max_distance
    qv = rel_bias.position_query(q)
    rel = (signed_relative_embeddings(rel_bias) if rel is None else rel).to(q.dtype)
    shape = qv.shape
    logits = torch.matmul(qv.reshape(shape[0], shape[1], -1, shape[-1]), rel.transpose(-1, -2).unsqueeze(0))
    logits = logits.view(*shape[:-1], 2 * m + 1)
    idx = (distance.clamp(-m, m) + m).expand(*logits.shape[:-1], distance.shape[-1])
    return logits.gather(-1, idx).masked_fill(distance.abs() > m, 0.0)


def vq_bidirectional(
    attn: VQAttention, q: Tensor, k: Tensor, v: Tensor, state: State | None
) -> tuple[Tensor, State, Aux]:
    """Encoder VQ attention for ``attn`` (a :class:`~tvq_exp.attention.vq.VQAttention` with
    ``causal=False``): ``q (B, H, T, d_k)``, ``k (B, H_kv, T, d_k)``, ``v (B, H_kv, T, d_v)`` ->
    ``(out (B, H, T, d_v), {"t": T}, aux)``."""
    if state is not None:
        raise ValueError("vq attention: a carried state only makes sense for causal attention")
    k_hat, codes, aux = attn.quantizer(k)
    b, h, t, dk = q.shape
    hk, L = k.shape[1], attn.block_len
    r = -(-t // L)
    pad = r * L - t
    valid = F.pad(torch.ones(t, dtype=torch.bool, device=q.device), (0, pad)).view(r, L)
    q, k_hat, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k_hat, v))
    codes = F.pad(codes, (0, pad)).view(b, hk, r, L)
    qb = q.view(b, hk, h // hk, r, L, dk)
    qc = qb if attn.bias is None else attn.bias.content_query(q).view_as(qb)
    vb = v.view(b, hk, 1, r, L, -1)
    acc = accumulation_dtype(q.dtype)

    s_win = (qc @ _window(k_hat.view(b, hk, 1, r, L, dk)).transpose(-1, -2)).to(acc)  # (B, Hk, G, R, L, 3L)
    if attn.bias is not None:
        dist = (
            torch.arange(L, 2 * L, device=q.device)[:, None] - torch.arange(3 * L, device=q.device)[None, :]
        )
        s_win = s_win + encoder_bias(attn.bias, q.view(b, h, r, L, dk), dist).view_as(s_win).to(acc)
    s_win = s_win.masked_fill(~_window(valid.view(1, 1, 1, r, L, 1)).transpose(-1, -2), float("-inf"))
    m = s_win.amax(-1, keepdim=True)
    if attn.use_cache:
        cache_n, cache_mu = _outside_stats(codes, vb.squeeze(2), valid, attn)
        c = attn.quantizer.codebook.detach().to(qc.dtype)
        s_cache = (qc @ c[None, :, None, None].transpose(-1, -2)).to(acc)  # (B, Hk, G, R, L, S)
        s_cache = s_cache + cache_n.clamp_min(1e-30).log().unsqueeze(2).unsqueeze(-2)
        s_cache = s_cache.masked_fill((cache_n == 0).unsqueeze(2).unsqueeze(-2), float("-inf"))
        m = torch.maximum(m, s_cache.amax(-1, keepdim=True))
    m = m.detach()
    a_win = (s_win - m).exp()
    num = (a_win.to(v.dtype) @ _window(vb)).to(acc)
    den = a_win.sum(-1, keepdim=True)
    if attn.use_cache:
        a_cache = (s_cache - m).exp()
        num = num + a_cache @ cache_mu.unsqueeze(2)
        den = den + a_cache.sum(-1, keepdim=True)
    out = (num / den).to(v.dtype).reshape(b, h, r * L, -1)
    return out[:, :, :t], {"t": t}, aux


def _window(x: Tensor) -> Tensor:
    """Blocks ``r-1, r, r+1`` side by side (zeros past either end) along dim 4 of ``(B, Hk, G, R, L, d)``."""
    before = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :, :-1]
    after = F.pad(x, (0, 0, 0, 0, 0, 1))[:, :, :, 1:]
    return torch.cat([before, x, after], dim=4)


def _outside_stats(codes: Tensor, vb: Tensor, valid: Tensor, attn: VQAttention) -> tuple[Tensor, Tensor]:
    """Per block ``r``: count and mean value per code over all blocks except ``r-1, r, r+1``.

    ``codes (B, Hk, R, L)``, ``vb (B, Hk, R, L, d_v)``, ``valid (R, L)`` ->
    ``(counts (B, Hk, R, S), means (B, Hk, R, S, d_v))`` in the accumulation dtype.
    """
    b, hk, r, L = codes.shape
    s, dv = attn.codebook_size, vb.shape[-1]
    acc = accumulation_dtype(vb.dtype)
    vf = (vb if attn.grad_through_cache else vb.detach()).to(acc)
    w = valid.to(acc).expand(b, hk, r, L)
    counts = torch.zeros(b, hk, r, s, device=vb.device, dtype=acc).scatter_add_(3, codes, w)
    sums = torch.zeros(b, hk, r, s, dv, device=vb.device, dtype=acc).scatter_add(
        3, codes[..., None].expand(b, hk, r, L, dv), vf * w[..., None]
    )
    means = sums / counts.clamp_min(1)[..., None]
    pre_n, pre_mu = _running_means(counts, means)  # entry j: blocks 0..j-1
    suf_n, suf_mu = (
        x.flip(2) for x in _running_means(counts.flip(2), means.flip(2))
    )  # entry j: blocks j..R-1
    before = (torch.arange(r, device=codes.device) - 1).clamp_min(0)  # blocks 0..r-2
    after = (torch.arange(r, device=codes.device) + 2).clamp_max(r)  # blocks r+2..R-1
    n_p, mu_p, n_s, mu_s = pre_n[:, :, before], pre_mu[:, :, before], suf_n[:, :, after], suf_mu[:, :, after]
    n = n_p + n_s
    mu = mu_p + (n_s / n.clamp_min(1))[..., None] * (mu_s - mu_p)
    return n, mu


def _running_means(counts: Tensor, means: Tensor) -> tuple[Tensor, Tensor]:
    """Exclusive running (count, mean) over dim 2: entry ``j`` merges entries ``0..j-1``.

    ``counts (B, Hk, R, S)``, ``means (B, Hk, R, S, d)`` -> ``(B, Hk, R+1, S)``, ``(B, Hk, R+1, S, d)``.
    """
    n_run, mu_run = torch.zeros_like(counts[:, :, 0]), torch.zeros_like(means[:, :, 0])
    out_n, out_mu = [n_run], [mu_run]
    for i in range(counts.shape[2]):
        n_new = n_run + counts[:, :, i]
        mu_run = mu_run + (counts[:, :, i] / n_new.clamp_min(1))[..., None] * (means[:, :, i] - mu_run)
        n_run = n_new
        out_n.append(n_run)
        out_mu.append(mu_run)
    return torch.stack(out_n, 2), torch.stack(out_mu, 2)
