"""The compressive cache of Transformer-VQ: per-code counts and running mean values, block by block.

For blocks ``0..R-1`` of ``L`` positions with codes ``z_t`` and values ``v_t``, entry ``j`` of the
prefix holds, per code ``s``, the count ``n_s`` and the mean ``μ_s`` of the values of the initial
cache (a carried state) and of blocks ``0..j-1``: ``μ_s^(j) = (n0_s·μ0_s + Σ_{t < jL, z_t = s} v_t) / n_s^(j)``.
Each block's per-code sums are computed at once (in fp32, fp64 for fp64 values, whatever the autocast
dtype), then their cumulative sum over the blocks, seeded with the carried state and accumulated in fp64,
divided by the counts (:func:`prefix_means`: one cumsum on a GPU). The fp64 accumulation is what keeps long
sequences accurate: a sum accumulated in fp32 drifts by up to ``j·ε`` of its size at entry ``j`` (as
Chan's running-mean update, ``μ ← μ + (c_s / n_s)·(m_s − μ)``, also does in fp32); with fp64's
``ε = 1.1e-16`` the means stay within the rounding of the per-block sums and of their fp32 result at any
practical length (``tests/attention/test_vq_cache.py`` bounds it at 32k tokens in 4096 blocks). Counts are exact integers in
fp64 (exact up to 2^53; fp32 would be exact only below 2^24 = 16.7M tokens).

:func:`running_code_means` computes the prefix without an autograd graph and gives the exact
gradient directly: ``∂L/∂v_t = Σ_{j > block(t)} [∂L/∂μ^(j)]_{z_t} / n_{z_t}^(j)``: a suffix sum over the
entries (:func:`suffix_sums_`), gathered by code.
:func:`tvq_exp.attention.vq.naive.running_code_means` is Chan's recurrence under plain autograd.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tvq_exp.attention.base import accumulation_dtype, own_copy


def block_stats(codes: Tensor, values: Tensor, valid: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Per-block counts ``(N, R, S)`` and means ``(N, R, S, d_v)`` of the valid positions (accumulation dtype)."""
    n, r, _ = codes.shape
    acc = accumulation_dtype(values.dtype)
    counts = torch.zeros(n, r, size, dtype=acc, device=codes.device)
    sums = torch.zeros(n, r, size, values.shape[-1], dtype=acc, device=codes.device)
    _add_by_code(codes, values, valid, counts, sums)
    return counts, sums.div_(counts.clamp_min(1)[..., None])


def _add_by_code(codes: Tensor, values: Tensor, valid: Tensor, counts: Tensor, sums: Tensor) -> None:
    """Add each valid position's count and value to row ``(n, block, code)`` of ``counts (N, R, S)`` and
    ``sums (N, R, S, d_v)``."""
    w = valid.to(sums.dtype).expand(codes.shape)
    counts.scatter_add_(2, codes, w)
    sums.scatter_add_(
        2, codes[..., None].expand(*codes.shape, values.shape[-1]), values.to(sums.dtype) * w[..., None]
    )


def _by_block(x: Tensor, by_block: bool | None) -> bool:
    """Whether to walk the blocks one by one (default: on a CPU, eager). Elsewhere one cumsum does it (on a GPU,
    one kernel; compiled, the compiler's scan); torch's CPU cumsum walks a dim that is not the innermost one
    element at a time: at (1, 33, 512, 256), 1 thread, it takes 39 ms where the block-by-block adds take 2.4 ms."""
    if by_block is None:
        return x.device.type == "cpu" and not torch.compiler.is_compiling()
    return by_block


def prefix_means(sums: Tensor, counts: Tensor, by_block: bool | None = None) -> Tensor:
    """Means ``(N, R, S, d)`` of the cumulative sums over the blocks (dim 1) of ``sums (N, R, S, d)``: divided by
    the cumulative ``counts (N, R, S)`` (fp64), accumulated in fp64, returned in ``sums``' dtype (block by block:
    written over ``sums``; see :func:`_by_block`)."""
    n = counts.clamp_min(1)[..., None]
    if not _by_block(sums, by_block):
        return sums.double().cumsum(1).div_(n).to(sums.dtype)
    total = sums[:, 0].to(torch.float64, copy=True)
    for j in range(sums.shape[1]):
        if j:
            total += sums[:, j]
        torch.div(total, n[:, j], out=sums[:, j])
    return sums


def suffix_sums_(x: Tensor, by_block: bool | None = None) -> Tensor:
    """``x (N, R, ...)``'s suffix sums over dim 1 (entry ``j``: the sum of entries ``j..R-1``), in its dtype, in
    place (see :func:`_by_block`)."""
    if not _by_block(x, by_block):
        return x.copy_(x.flip(1).cumsum(1).flip(1))
    for j in range(x.shape[1] - 2, -1, -1):
        x[:, j] += x[:, j + 1]
    return x


class _RunningCodeMeans(torch.autograd.Function):
    @staticmethod
    def forward(ctx, codes, values, valid, n0, mu0):  # noqa: ANN001
        n, r, _ = codes.shape
        acc = accumulation_dtype(values.dtype)
        # entry 0: the carried state; entry j + 1: block j's counts and sums
        counts = torch.zeros(n, r + 1, n0.shape[-1], dtype=acc, device=codes.device)
        sums = torch.empty(n, r + 1, *mu0.shape[1:], dtype=acc, device=codes.device)
        sums[:, 1:].zero_()
        sums[:, 0] = n0[..., None] * mu0
        _add_by_code(codes, values, valid, counts[:, 1:], sums[:, 1:])
        out_n = counts.double()
        out_n[:, 0] = n0
        out_n = out_n.cumsum_(1)  # exact integers
        out_mu = prefix_means(sums, out_n)
        ctx.save_for_backward(codes, valid, out_n)
        ctx.values_dtype = values.dtype
        ctx.mark_non_differentiable(out_n)
        return out_n, out_mu

    @staticmethod
    def backward(ctx, _grad_n, grad_mu):  # noqa: ANN001
        codes, valid, out_n = ctx.saved_tensors
        n = out_n[:, 1:, :, None]
        share = torch.where(n > 0, grad_mu[:, 1:] / n.clamp_min(1).to(grad_mu.dtype), 0.0)  # entries 1..R
        suffix = suffix_sums_(share)  # entry j: Σ over entries >= j
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


class CacheMeans(NamedTuple):
    """The running code means as the layer reads them, of ``N`` sequences (:func:`cache_means`).

    Fields:
        counts: ``(N, R + 1, S)`` fp64, every entry (exact integers).
        items: ``(N, I, S, d_v)``, in the values' dtype (what the kernels' products take): item ``i`` (block
            ``first + i``) reads entry ``max(first + i - 1, 0)`` (a block sees the cache of the blocks two and more
            before it). Gradients flow through it to the values.
        state: ``(N, S, d_v)`` fp32: the entry a carried state keeps (no gradient), a tensor of its own.
    """

    counts: Tensor
    items: Tensor
    state: Tensor


def cache_means(
    codes: Tensor, values: Tensor, valid: Tensor, n0: Tensor, mu0: Tensor, first: int, items: int, state: int
) -> CacheMeans:
    """:func:`running_code_means` (arguments there) as the layer reads them: :class:`CacheMeans` of ``items`` blocks
    from ``first`` on, and entry ``state`` for the carried state. The plain reference of
    :func:`~tvq_exp.attention.vq.fused.prefix.fused_cache_means`."""
    counts, means = running_code_means(codes, values, valid, n0, mu0)
    return CacheMeans(
        counts,
        item_entries(means, first, first + items - 1, values.dtype),
        own_copy(means[:, state].detach()),
    )


def item_entries(prefix: Tensor, first: int, last: int, dtype: torch.dtype | None = None) -> Tensor:
    """Entries ``r - 1`` (clamped at 0) of a prefix ``(N, E, ...)`` for the blocks ``r = first..last``, along dim 1,
    in ``dtype`` (default the prefix's)."""
    if last < first:  # no block
        return prefix[:, :0].to(dtype or prefix.dtype)
    if first > 0:
        return prefix[:, first - 1 : last].to(dtype or prefix.dtype)
    return _FirstEntryTwice.apply(prefix, last, dtype or prefix.dtype)


class _FirstEntryTwice(torch.autograd.Function):
    """Entries ``0, 0, 1, .., last - 1`` of a prefix ``(N, E, ...)`` along dim 1 (``E > last``), cast to ``dtype``:
    one copy forward and one backward. A join of two slices after a cast took two copies of the entries forward and
    three backward (two slices' gradients, each the whole prefix's size, their sum, and the cast's)."""

    @staticmethod
    def forward(ctx, prefix: Tensor, last: int, dtype: torch.dtype) -> Tensor:  # noqa: ANN001
        ctx.shape, ctx.dtype, ctx.last = prefix.shape, prefix.dtype, last
        out = prefix.new_empty(prefix.shape[0], last + 1, *prefix.shape[2:], dtype=dtype)
        out[:, :1] = prefix[:, :1]
        out[:, 1:] = prefix[:, :last]
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        last = ctx.last
        d = grad.new_empty(ctx.shape, dtype=ctx.dtype)
        d[:, :last] = grad[:, 1:]
        d[:, last:] = 0  # entries no block reads
        d[:, 0].add_(grad[:, 0])
        return d, None, None


__all__ = [
    "CacheMeans",
    "block_stats",
    "cache_means",
    "item_entries",
    "prefix_means",
    "running_code_means",
    "suffix_sums_",
]
