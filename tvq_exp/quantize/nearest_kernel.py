"""The Triton kernel of the nearest-code search (see :mod:`.fused_nearest`): loaded by
:func:`tvq_exp.nn.triton_loader.load_kernels` once per mode (compiled, or interpreted on the CPU), never
imported directly.

One program per ``BM`` rows of one head: the rows stay in registers while the code tiles stream past; each tile's
distances ``||c||² - 2·x·c`` (fp32, the product at ``PREC``) update a running minimum and its first index, so
neither the ``(N, S)`` distances nor a second pass over them ever reach memory.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _first_min(v1, i1, v2, i2):
    """The smaller value and its index (the lower index on a tie: torch.argmin's first occurrence)."""
    take = (v1 < v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)


@triton.jit
def nearest_kernel(
    x_ptr, c_ptr, c2_ptr, out_ptr,
    N, S, D,
    BM: tl.constexpr, BS: tl.constexpr, DK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Rows ``x (H, N, D)``, scaled codes ``c = -2·C (H, S, D)`` and ``c2 = ||C||² (H, S)``, all fp32 and contiguous:
    ``out (H, N)`` int64, the index of each row's nearest code."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    rows = pid * BM + tl.arange(0, BM)
    dims = tl.arange(0, DK)
    row_ok = rows < N
    x = tl.load(
        x_ptr + h * N * D + rows[:, None].to(tl.int64) * D + dims[None, :],
        mask=row_ok[:, None] & (dims[None, :] < D), other=0.0,
    )  # fmt: skip
    best = tl.full([BM], float("inf"), tl.float32)
    arg = tl.full([BM], 0, tl.int32)
    for s0 in range(0, S, BS):
        codes = s0 + tl.arange(0, BS)
        code_ok = codes < S
        c = tl.load(
            c_ptr + h * S * D + codes[None, :] * D + dims[:, None],
            mask=code_ok[None, :] & (dims[:, None] < D), other=0.0,
        )  # fmt: skip
        c2 = tl.load(c2_ptr + h * S + codes, mask=code_ok, other=float("inf"))
        dist = tl.dot(x, c, input_precision=PREC) + c2[None, :]
        index = tl.broadcast_to(codes[None, :], (BM, BS))
        tile_best, tile_arg = tl.reduce((dist, index), 1, _first_min)
        take = tile_best < best  # strictly: an earlier tile's equal distance has the lower index
        best = tl.where(take, tile_best, best)
        arg = tl.where(take, tile_arg, arg)
    tl.store(out_ptr + h * N + rows, arg.to(tl.int64), mask=row_ok)
