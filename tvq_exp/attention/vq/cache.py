"""The compressive cache of Transformer-VQ: per-code counts and running mean values, block by block.

For blocks ``0..R-1`` of ``L`` positions with codes ``z_t`` and values ``v_t``, entry ``j`` of the
prefix holds, per code ``s``, the count ``n_s`` and the mean ``μ_s`` of the values of the initial
cache (a carried state) and of blocks ``0..j-1``: ``μ_s^(j) = (n0_s·μ0_s + Σ_{t < jL, z_t = s} v_t) / n_s^(j)``.
All entries are computed at once: each block's per-code sums (in the accumulation dtype, fp32 for
half-precision values), then one cumulative sum over the blocks, seeded with the carried state, in
fp64, divided by the counts. The fp64 prefix is what keeps long sequences exact: a cumulative sum in
fp32 loses ``O(j·ε)`` of the sum at entry ``j`` (a relative error growing with the length, as Chan's
running-mean update also does in fp32), fp64's ``ε = 1.1e-16`` leaves the means within the rounding
of their fp32 result and of the per-block sums, at any practical length. Counts are exact integers in
fp64 (exact up to 2^53; fp32 would be exact only below 2^24 = 16.7M tokens).

:func:`running_code_means` computes the prefix without an autograd graph and gives the exact
gradient directly: ``∂L/∂v_t = Σ_{j > block(t)} [∂L/∂μ^(j)]_{z_t} / n_{z_t}^(j)``: a suffix sum over the
entries (a reversed cumulative sum), gathered by code.
:func:`tvq_exp.attention.vq.naive.running_code_means` is the recurrence (Chan's update,
``μ ← μ + (c_s / n_s)·(m_s − μ)``) under plain autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.base import accumulation_dtype


def block_sums(codes: Tensor, values: Tensor, valid: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Per-block counts ``(N, R, S)`` and sums ``(N, R, S, d_v)`` of the valid positions (accumulation dtype)."""
    n, r, L = codes.shape
    acc = accumulation_dtype(values.dtype)
    w = valid.to(acc).expand(n, r, L)
    counts = torch.zeros(n, r, size, dtype=acc, device=codes.device).scatter_add_(2, codes, w)
    sums = torch.zeros(n, r, size, values.shape[-1], dtype=acc, device=codes.device)
    sums.scatter_add_(
        2, codes[..., None].expand(*codes.shape, values.shape[-1]), values.to(acc) * w[..., None]
    )
    return counts, sums


def block_stats(codes: Tensor, values: Tensor, valid: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Per-block counts ``(N, R, S)`` and means ``(N, R, S, d_v)`` of the valid positions (accumulation dtype)."""
    counts, sums = block_sums(codes, values, valid, size)
    return counts, sums.div_(counts.clamp_min(1)[..., None])


class _RunningCodeMeans(torch.autograd.Function):
    @staticmethod
    def forward(ctx, codes, values, valid, n0, mu0):  # noqa: ANN001
        counts, sums = block_sums(codes, values, valid, n0.shape[-1])
        out_n = torch.cat([n0[:, None], counts.double()], dim=1).cumsum_(dim=1)  # exact integers
        total = torch.cat([(n0[..., None] * mu0)[:, None], sums.double()], dim=1).cumsum_(dim=1)
        out_mu = total.div_(out_n.clamp_min(1)[..., None]).to(sums.dtype)
        ctx.save_for_backward(codes, valid, out_n)
        ctx.values_dtype = values.dtype
        ctx.mark_non_differentiable(out_n)
        return out_n, out_mu

    @staticmethod
    def backward(ctx, _grad_n, grad_mu):  # noqa: ANN001
        codes, valid, out_n = ctx.saved_tensors
        n = out_n[:, 1:, :, None]
        share = torch.where(n > 0, grad_mu[:, 1:] / n.clamp_min(1).to(grad_mu.dtype), 0.0)  # entries 1..R
        suffix = share.flip(1).cumsum_(dim=1).flip(1)  # entry j: Σ over entries >= j
        # block b feeds entries b+1..R: row (n, b, z_t) of the suffix sums, for every position t
        size, dv_dim = suffix.shape[2], suffix.shape[3]
        n_idx = torch.arange(codes.shape[0], device=codes.device)[:, None, None] * codes.shape[1]
        rows = (n_idx + torch.arange(codes.shape[1], device=codes.device)[:, None]) * size + codes
        dv = suffix.reshape(-1, dv_dim).index_select(0, rows.flatten()).view(*codes.shape, dv_dim)
        dv = dv * valid.to(dv.dtype)[..., None]
        return None, dv.to(ctx.values_dtype), None, None, None


def running_code_means(
    codes: Tensor, values: Tensor, valid: Tensor, n0: Tensor, mu0: Tensor
) -> tuple[Tensor, Tensor]:
    """Prefix counts and running means of the values per code, block by block.

    Args:
        codes: ``(N, R, L)`` code of each position; ``values``: ``(N, R, L, d_v)``.
        valid: ``(R, L)`` real positions (padding never enters the cache).
        n0, mu0: the initial cache ``(N, S)`` and ``(N, S, d_v)`` (a carried state; no gradient).

    Returns ``counts (N, R + 1, S)`` in float64 (exact integers whatever the length) and ``means
    (N, R + 1, S, d_v)`` in the accumulation dtype; entry ``j`` covers the initial cache and blocks
    ``0..j-1``. Gradients flow to ``values``.
    """
    acc = accumulation_dtype(values.dtype)
    return _RunningCodeMeans.apply(codes, values, valid, n0.double(), mu0.to(acc))


__all__ = ["block_stats", "block_sums", "running_code_means"]
