"""Bidirectional (encoder) Transformer-VQ attention.

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

import torch
import torch.nn.functional as F
from torch import Tensor

from tvq_exp.attention.base import accumulation_dtype
from tvq_exp.attention.vq.cache import running_code_means
from tvq_exp.nn.position import XLRelativeBias


def encoder_attention(
    q: Tensor,
    k_hat: Tensor,
    codes: Tensor,
    v: Tensor,
    codebook: Tensor,
    bias: XLRelativeBias | None,
    block_len: int,
    use_cache: bool,
    grad_through_cache: bool,
) -> Tensor:
    """Encoder VQ attention: queries ``q (B, H, T, d_k)`` over quantised keys ``k_hat (B, H_kv, T, d_k)``
    with their ``codes (B, H_kv, T)``, values ``v (B, H_kv, T, d_v)`` and the ``codebook (H_kv, S, d_k)``
    -> ``(B, H, T, d_v)``."""
    b, h, t, dk = q.shape
    hk, L = k_hat.shape[1], block_len
    r = -(-t // L)
    pad = r * L - t
    valid = F.pad(torch.ones(t, dtype=torch.bool, device=q.device), (0, pad)).view(r, L)
    q, k_hat, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k_hat, v))
    codes = F.pad(codes, (0, pad)).view(b, hk, r, L)
    qb = q.view(b, hk, h // hk, r, L, dk)
    qc = qb if bias is None else bias.content_query(q).view_as(qb)
    vb = v.view(b, hk, 1, r, L, -1)
    acc = accumulation_dtype(q.dtype)

    s_win = (qc @ _window(k_hat.view(b, hk, 1, r, L, dk)).transpose(-1, -2)).to(acc)  # (B, Hk, G, R, L, 3L)
    if bias is not None:
        dist = (
            torch.arange(L, 2 * L, device=q.device)[:, None] - torch.arange(3 * L, device=q.device)[None, :]
        )
        s_win = s_win + bias.encoder_bias(q.view(b, h, r, L, dk), dist).view_as(s_win).to(acc)
    s_win = s_win.masked_fill(~_window(valid.view(1, 1, 1, r, L, 1)).transpose(-1, -2), float("-inf"))
    m = s_win.amax(-1, keepdim=True)
    if use_cache:
        values = vb.squeeze(2) if grad_through_cache else vb.squeeze(2).detach()
        cache_n, cache_mu = _outside_stats(codes, values, valid, codebook.shape[1])
        c = codebook.detach().to(qc.dtype)
        s_cache = (qc @ c[None, :, None, None].transpose(-1, -2)).to(acc)  # (B, Hk, G, R, L, S)
        s_cache = s_cache + cache_n.clamp_min(1e-30).log().to(acc).unsqueeze(2).unsqueeze(-2)
        s_cache = s_cache.masked_fill((cache_n == 0).unsqueeze(2).unsqueeze(-2), float("-inf"))
        m = torch.maximum(m, s_cache.amax(-1, keepdim=True))
    m = m.detach()
    a_win = (s_win - m).exp()
    num = (a_win.to(v.dtype) @ _window(vb)).to(acc)
    den = a_win.sum(-1, keepdim=True)
    if use_cache:
        a_cache = (s_cache - m).exp()
        num = num + a_cache @ cache_mu.unsqueeze(2)
        den = den + a_cache.sum(-1, keepdim=True)
    out = (num / den).to(v.dtype).reshape(b, h, r * L, -1)
    return out[:, :, :t]


def _window(x: Tensor) -> Tensor:
    """Blocks ``r-1, r, r+1`` side by side (zeros past either end) along dim 4 of ``(B, Hk, G, R, L, d)``."""
    before = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :, :-1]
    after = F.pad(x, (0, 0, 0, 0, 0, 1))[:, :, :, 1:]
    return torch.cat([before, x, after], dim=4)


def _outside_stats(codes: Tensor, vb: Tensor, valid: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Per block ``r``: count and mean value per code over all blocks except ``r-1, r, r+1``.

    ``codes (B, Hk, R, L)``, ``vb (B, Hk, R, L, d_v)``, ``valid (R, L)`` ->
    ``(counts (B, Hk, R, S), means (B, Hk, R, S, d_v))`` in the accumulation dtype: the running means
    of the blocks before (an exclusive prefix) merged with those of the blocks after (a suffix).
    """
    b, hk, r, _ = codes.shape
    flat_codes, flat_v = codes.flatten(0, 1), vb.flatten(0, 1)
    n0 = torch.zeros(b * hk, size, device=vb.device)
    mu0 = torch.zeros(b * hk, size, vb.shape[-1], device=vb.device)
    pre_n, pre_mu = running_code_means(flat_codes, flat_v, valid, n0, mu0)  # entry j: blocks 0..j-1
    suf_n, suf_mu = (  # entry j: blocks j..R-1
        x.flip(1) for x in running_code_means(flat_codes.flip(1), flat_v.flip(1), valid.flip(0), n0, mu0)
    )
    before = (torch.arange(r, device=codes.device) - 1).clamp_min(0)  # blocks 0..r-2
    after = (torch.arange(r, device=codes.device) + 2).clamp_max(r)  # blocks r+2..R-1
    n_p, mu_p, n_s, mu_s = pre_n[:, before], pre_mu[:, before], suf_n[:, after], suf_mu[:, after]
    n = n_p + n_s
    mu = mu_p + (n_s / n.clamp_min(1)).to(mu_p.dtype)[..., None] * (mu_s - mu_p)
    return n.unflatten(0, (b, hk)), mu.unflatten(0, (b, hk))
