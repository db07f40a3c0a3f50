"""The Triton kernels of the quantiser's one pass over its keys (see :mod:`.fused_statistics`): loaded by
:func:`tvq_exp.nn.triton_loader.load_kernels` once per mode (compiled, or interpreted on the CPU), never imported
directly.

One program per ``BM`` keys of one head, each key's ``d`` values in registers: the key is read once, its code's row
gathered (from L2: a head's codebook is ``S·d``, 256 KiB at ``S = 512``, ``d = 128`` fp32), and everything the
quantiser needs of the pair is done at once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _key_rows(pid, h, codes_ptr, T, N, D, BM: tl.constexpr, DK: tl.constexpr):
    """This program's keys: their code, batch and position, whether they exist, the padded dimensions, the mask."""
    n = pid * BM + tl.arange(0, BM)
    ok = n < N
    z = tl.load(codes_ptr + h * N + n, mask=ok, other=0)
    n = n.to(tl.int64)
    dims = tl.arange(0, DK)
    mask = ok[:, None] & (dims[None, :] < D)
    return z, n // T, n % T, ok, dims, mask


@triton.jit
def _total(x):
    """The sum of a 2-D tile, by rows then over them (``tl.sum`` is a jit function of the mode Triton was first
    imported in: :func:`~tvq_exp.nn.triton_loader.load_kernels`)."""
    return tl.reduce(tl.reduce(x, 1, tl.standard._sum_combine), 0, tl.standard._sum_combine)


@triton.jit
def statistics_kernel(
    x_ptr, codes_ptr, c_ptr, cx_ptr, rows_ptr, moments_ptr, counts_ptr, sums_ptr,
    T, N, S, D, P,
    sx_b, sx_h, sx_t, sr_b, sr_h, sr_t,
    BM: tl.constexpr, DK: tl.constexpr, SUMS: tl.constexpr,
):  # fmt: skip
    """Keys ``x (B, H, T, D)`` (strides ``sx_*``, the last dimension contiguous), their codes ``(H, N = B·T)``
    (``n = b·T + t``), the codebook ``c (H, S, D)`` fp32 and ``cx``, the same rows in the keys' dtype:

    - ``rows`` (strides ``sr_*``, the keys' layout): each key's code row ``cx[z]``, copied as it is;
    - ``moments (2, H, P)`` fp32: per program (``P`` a head), ``Σ ||x - c[z]||²`` and ``Σ ||x||²`` over its keys
      (the caller sums the ``P`` partial sums: no atomics, the same sums every run);
    - ``counts (H, S)`` fp32 ``+=`` one per key at its code; with ``SUMS``, ``sums (H, S, D)`` fp32 ``+=`` the key
      at its code (atomic adds, as ``scatter_add_`` on a GPU: the order of the additions is the device's)."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    z, b, t, ok, dims, mask = _key_rows(pid, h, codes_ptr, T, N, D, BM, DK)
    x = tl.load(
        x_ptr + h * sx_h + b[:, None] * sx_b + t[:, None] * sx_t + dims[None, :], mask=mask, other=0.0
    )
    x = x.to(tl.float32)
    code = (h * S + z[:, None]) * D + dims[None, :]
    c = tl.load(c_ptr + code, mask=mask, other=0.0)
    row = tl.load(cx_ptr + code, mask=mask, other=0.0)
    tl.store(rows_ptr + h * sr_h + b[:, None] * sr_b + t[:, None] * sr_t + dims[None, :], row, mask=mask)
    diff = x - c
    tl.store(moments_ptr + h * P + pid, _total(diff * diff))
    tl.store(moments_ptr + (tl.num_programs(1) + h) * P + pid, _total(x * x))
    tl.atomic_add(counts_ptr + h * S + z, tl.full([BM], 1.0, tl.float32), mask=ok)
    if SUMS:
        tl.atomic_add(sums_ptr + code, x, mask=mask)


@triton.jit
def error_grad_kernel(
    x_ptr, codes_ptr, c_ptr, g_ptr, dx_ptr,
    T, N, S, D,
    sx_b, sx_h, sx_t, sd_b, sd_h, sd_t,
    BM: tl.constexpr, DK: tl.constexpr,
):  # fmt: skip
    """The gradient of ``Σ ||x - c[z]||²`` (the codes held constant) times ``g[0]`` (fp32): ``dx = 2·g·(x - c[z])``
    in the keys' dtype, in the layout of the strides ``sd_*``."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    z, b, t, ok, dims, mask = _key_rows(pid, h, codes_ptr, T, N, D, BM, DK)
    x = tl.load(
        x_ptr + h * sx_h + b[:, None] * sx_b + t[:, None] * sx_t + dims[None, :], mask=mask, other=0.0
    )
    c = tl.load(c_ptr + (h * S + z[:, None]) * D + dims[None, :], mask=mask, other=0.0)
    dx = (2.0 * tl.load(g_ptr)) * (x.to(tl.float32) - c)
    tl.store(dx_ptr + h * sd_h + b[:, None] * sd_b + t[:, None] * sd_t + dims[None, :], dx, mask=mask)


@triton.jit
def metrics_kernel(
    counts_ptr, sq_error_ptr, sq_norm_ptr, out_ptr,
    H, S, numel, share,
    BS: tl.constexpr,
):  # fmt: skip
    """The quantiser's three metrics from ``counts (H, S)`` fp32 and the 0-d sums ``Σ ||x - c[z]||²`` and ``Σ ||x||²``
    over ``numel`` key values, in one program (``BS`` codes a step): ``out (3,)`` fp32 = the heads' mean usage
    perplexity (``exp`` of the entropy of a head's code frequencies), the relative error ``Σ||x - c[z]||² /
    max(Σ||x||², 1e-12·numel)``, and the heads' mean count of dead codes (used fewer than ``share`` of the fair share
    ``N/S``; with ``share = 0``, never used). Counts are whole numbers: their sums are exact in any order."""
    perplexity = 0.0
    dead = 0.0
    for h in range(H):
        total = 0.0
        for s0 in range(0, S, BS):
            s = s0 + tl.arange(0, BS)
            total += tl.reduce(
                tl.load(counts_ptr + h * S + s, mask=s < S, other=0.0), 0, tl.standard._sum_combine
            )
        denom = tl.maximum(total, 1e-12)
        threshold = share * (total / S)
        entropy = 0.0
        dead_here = 0.0
        for s0 in range(0, S, BS):
            s = s0 + tl.arange(0, BS)
            c = tl.load(counts_ptr + h * S + s, mask=s < S, other=0.0)
            p = c / denom
            term = tl.where(s < S, p * tl.log(tl.maximum(p, 1e-12)), 0.0)
            is_dead = (s < S) & tl.where(share > 0, c < threshold, c <= 0)
            entropy += tl.reduce(term, 0, tl.standard._sum_combine)
            dead_here += tl.reduce(is_dead.to(tl.float32), 0, tl.standard._sum_combine)
        perplexity += tl.exp(-entropy)
        dead += dead_here / S
    tl.store(out_ptr, perplexity / H)
    tl.store(out_ptr + 1, tl.load(sq_error_ptr) / tl.maximum(tl.load(sq_norm_ptr), 1e-12 * numel))
    tl.store(out_ptr + 2, dead / H * S)
