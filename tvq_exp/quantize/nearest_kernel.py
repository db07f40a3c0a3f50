"""The Triton kernel of the nearest-code search (see :mod:`.fused_nearest`): loaded by
:func:`tvq_exp.nn.triton_loader.load_kernels` once per mode (compiled, or interpreted on the CPU), never
imported directly.

One program per ``BM`` rows of one head: the rows stay in registers while the code tiles stream past; each tile's
distances ``||c||² - 2·x·c`` (fp32) update a running minimum and its first index, so neither the ``(N, S)``
distances nor a second pass over them ever reach memory. The product ``x·(-2c)`` is the sum of ``PIECES`` products:
the fp32 scaled codes (at ``PREC``), or bf16 keys against the scaled codes' three bf16 pieces, smallest first (each
product exact in fp32, summed in fp32).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def nearest_kernel(
    x_ptr, c_ptr, c2_ptr, out_ptr,
    N, S, D, stride_xh, stride_xn,
    BM: tl.constexpr, BS: tl.constexpr, DK: tl.constexpr, PIECES: tl.constexpr, DOT: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Rows ``x (H, N, D)`` (fp32, or bf16 with three pieces; strides ``stride_xh``, ``stride_xn``, the last
    dimension contiguous), the scaled codes ``-2·C`` as ``PIECES`` pieces ``(H, PIECES, S, D)`` whose fp32 sum is
    ``-2·C``, smallest first, and ``c2 = ||C||² (H, S)`` fp32: ``out (H, N)`` int64, the index of each row's nearest code.
    Products in ``DOT``."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    rows = pid * BM + tl.arange(0, BM)
    dims = tl.arange(0, DK)
    row_ok = rows < N
    x = tl.load(
        x_ptr + h * stride_xh + rows[:, None].to(tl.int64) * stride_xn + dims[None, :],
        mask=row_ok[:, None] & (dims[None, :] < D), other=0.0,
    ).to(DOT)  # fmt: skip
    best = tl.full([BM], float("inf"), tl.float32)
    arg = tl.full([BM], 0, tl.int32)
    for s0 in range(0, S, BS):
        codes = s0 + tl.arange(0, BS)
        code_ok = codes < S
        dist = tl.full([BM, BS], 0.0, tl.float32)
        for p in tl.static_range(PIECES):
            c = tl.load(
                c_ptr + (h * PIECES + p) * S * D + codes[None, :] * D + dims[:, None],
                mask=code_ok[None, :] & (dims[:, None] < D), other=0.0,
            )  # fmt: skip
            dist = tl.dot(x, c.to(DOT), dist, input_precision=PREC)
        dist += tl.load(c2_ptr + h * S + codes, mask=code_ok, other=float("inf"))[None, :]
        # the tile's minimum and its first column (torch.argmin's first occurrence; the interpreter runs this combine
        # as numpy's argmin, which returns the column)
        column = tl.broadcast_to(tl.arange(0, BS)[None, :], (BM, BS))
        tile_best, tile_arg = tl.reduce((dist, column), 1, tl.standard._argmin_combine_tie_break_left)
        take = tile_best < best  # strictly: an earlier tile's equal distance has the lower index
        best = tl.where(take, tile_best, best)
        arg = tl.where(take, s0 + tile_arg, arg)
    tl.store(out_ptr + h * N + rows, arg.to(tl.int64), mask=row_ok)


@triton.jit
def pieces_kernel(
    c_ptr, c2_ptr, pieces_ptr,
    R, S, D,
    BR: tl.constexpr, DK: tl.constexpr, PIECES: tl.constexpr,
):  # fmt: skip
    """The codebook ``c (H, S, D)`` fp32 (``R = H·S`` rows, ``BR`` a program) as :data:`nearest_kernel` reads it:
    ``c2 (H, S)`` = ``||c||²`` and ``pieces (H, PIECES, S, D)``, ``-2·c`` itself (``PIECES = 1``, fp32) or its three
    bf16 pieces, smallest first, each what the larger ones leave rounded to nearest even by its bits (exact values:
    they store as they are, also where the interpreter's fp32 → bf16 stores truncate)."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    dims = tl.arange(0, DK)
    ok = r < R
    mask = ok[:, None] & (dims[None, :] < D)
    r = r.to(tl.int64)
    c = tl.load(c_ptr + r[:, None] * D + dims[None, :], mask=mask, other=0.0)
    tl.store(c2_ptr + r, tl.reduce(c * c, 1, tl.standard._sum_combine), mask=ok)
    rest = -2.0 * c
    at = (r // S * PIECES * S + r % S)[:, None] * D + dims[None, :]  # the largest piece's place
    for i in tl.static_range(PIECES):
        piece = rest
        if PIECES > 1:
            bits = rest.to(tl.int32, bitcast=True)
            piece = ((bits + (0x7FFF + ((bits >> 16) & 1))) & -65536).to(tl.float32, bitcast=True)
        tl.store(pieces_ptr + at + (PIECES - 1 - i) * S * D, piece.to(pieces_ptr.dtype.element_ty), mask=mask)
        rest = rest - piece
