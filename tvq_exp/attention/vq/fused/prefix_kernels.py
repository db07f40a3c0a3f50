"""The Triton kernels of the cache's running code means (see :mod:`.prefix` for the algorithm).

Loaded by :func:`tvq_exp.attention.vq.fused.prefix.prefix_kernels` (never imported directly), once per mode: compiled,
or interpreted on the CPU.

Names: ``n`` the sequence, ``r`` a block of ``L`` positions ``t``, ``s`` a code, ``d`` a value column. The forward
is two kernels: :func:`block_sums_kernel` (every block at once: its per-code sums, one product per ``BT`` positions
of a code tile's run in the block's sorted codes: the one-hot ``(BS, BT)`` of the positions' codes times their values
``(BT, BD)``, exact products, 0 or 1 times a value, summed in fp32) and :func:`prefix_forward_kernel` (per codes and
columns, the blocks in order: running sums and counts in fp64, the means where the items read them). The backward is
two as well: :func:`prefix_backward_kernel` (per codes and columns, the blocks in reverse: the suffix sums of the
items' gradients over the counts) and :func:`code_rows_kernel` (every position at once: its code's row of its block's
suffix sums).

The values (and their gradient) are read (written) where they lie: ``(B, HK, R, L, D)`` (sequence ``n`` is head
``n % HK`` of batch ``n // HK``; ``(N, R, L, D)`` is ``HK = 1``), columns at stride 1, the rest at unit strides
(strides over ``D``) ``STRIDE_B``, ``STRIDE_H`` and ``STRIDE_T``, the position's: the blocks are cut from one time
axis, position ``t`` of block ``r`` at row ``(r·L + t)·STRIDE_T`` (:func:`_first_row`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _codes(z_ptr, n, r, t, t_ok, R, L):
    """The codes of positions ``t`` of block ``r`` of sequence ``n``, ``-1`` where padded: one load of the codes the
    op masked before the launch (a second load of an int8 mask in a loop is too small for an asynchronous copy, so
    each step waits for it: Triton 3.8's sm_90a TTGIR)."""
    return tl.load(z_ptr + (n * R + r) * L + t, mask=t_ok, other=-1)


@triton.jit
def _first_row(n, r, L, HK, STRIDE_B, STRIDE_H, STRIDE_T):
    """Where block ``r`` of sequence ``n`` begins in the values, in rows of ``D`` (its position ``t`` at
    ``+ t·STRIDE_T``): sequence ``n`` is head ``n % HK`` of batch ``n // HK``."""
    return (n // HK) * STRIDE_B + (n % HK) * STRIDE_H + r * L * STRIDE_T


@triton.jit
def _run(zs_ptr, nr, low, high, L, BC: tl.constexpr):
    """Where codes ``low..high-1`` begin and end in block ``nr``'s sorted codes: how many are below each (the padded
    positions' ``-1`` come first, below every code), ``BC`` codes a step."""
    first = 0
    end = 0
    for c0 in range(0, L, BC):
        c = c0 + tl.arange(0, BC)
        z = tl.load(zs_ptr + nr * L + c, mask=c < L, other=high)
        first += tl.reduce(tl.where(z < low, 1, 0), 0, tl.standard._sum_combine)
        end += tl.reduce(tl.where(z < high, 1, 0), 0, tl.standard._sum_combine)
    return first, end


@triton.jit
def block_sums_kernel(
    zs_ptr, order_ptr, v_ptr, sums_ptr, cnt_ptr,
    R, L, S, D, HK, STRIDE_B, STRIDE_H, STRIDE_T,
    BS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(N·R·cdiv(S, BS)·cdiv(D, BD),)``: block ``r`` of sequence ``n``'s sums ``(BS, BD)`` of codes ``s``,
    columns ``d`` (fp32, into ``sums (N, R, S, D)``) and, by the programs of column block 0, its counts (fp32, into
    ``cnt (N, R, S)``), from the block's codes sorted (``zs (N, R, L)``, stable), the positions in that order
    (``order``) and the values ``v`` (where they lie: the module's docstring). The positions of codes ``s`` are one
    run of the sorted order: a program reads only those (``L·BS/S`` when the codes are used evenly), ``BT`` a step,
    gathering their value rows, so a block's values are read once per ``BD`` columns and its one-hot products cost
    ``L·BS·D`` multiply-adds, not ``L·S·D``. A block's programs are consecutive, so that they run together and share
    its codes in L2."""
    pid, tiles_s, tiles_d = tl.program_id(0), (S + BS - 1) // BS, (D + BD - 1) // BD
    db = pid % tiles_d
    sb = (pid // tiles_d) % tiles_s
    nr = pid // (tiles_d * tiles_s)
    row0 = _first_row(nr // R, nr % R, L, HK, STRIDE_B, STRIDE_H, STRIDE_T)
    s = sb * BS + tl.arange(0, BS)
    d = db * BD + tl.arange(0, BD)
    first, end = _run(zs_ptr, nr, sb * BS, tl.minimum(sb * BS + BS, S), L, BC)
    block = tl.full([BS, BD], 0.0, tl.float32)
    block_n = tl.full([BS], 0.0, tl.float32)
    for t0 in range(first, end, BT):
        t = t0 + tl.arange(0, BT)
        t_ok = t < end
        z = tl.load(zs_ptr + nr * L + t, mask=t_ok, other=-1)
        p = tl.load(order_ptr + nr * L + t, mask=t_ok, other=0)
        hit = tl.where(s[:, None] == z[None, :], 1.0, 0.0)  # (BS, BT)
        v = tl.load(v_ptr + (row0 + p * STRIDE_T)[:, None] * D + d[None, :],
                    mask=t_ok[:, None] & (d < D)[None, :], other=0.0)  # fmt: skip
        block += tl.dot(hit.to(DOT), v.to(DOT), input_precision=PREC)
        block_n += tl.reduce(hit, 1, tl.standard._sum_combine)
    s_ok = s < S
    tl.store(sums_ptr + (nr * S + s)[:, None] * D + d[None, :], block, mask=s_ok[:, None] & (d < D)[None, :])
    tl.store(cnt_ptr + nr * S + s, block_n, mask=s_ok & (db == 0))


@triton.jit
def _add_block(sums_ptr, cnt_ptr, n, r, s, s_ok, cell, cell_ok, R, S, D, cnt, total):
    """The running counts ``(BS,)`` and sums ``(BS, BD)`` (fp64) with block ``r`` of sequence ``n`` added."""
    block = n * R + r
    block_n = tl.load(cnt_ptr + block * S + s, mask=s_ok, other=0.0)
    sums = tl.load(sums_ptr + block * S * D + cell, mask=cell_ok, other=0.0)
    return cnt + block_n.to(tl.float64), total + sums.to(tl.float64)


@triton.jit
def _mean(cnt, total):
    """The means ``(BS, BD)`` of running sums ``total`` over counts ``cnt`` (fp64), rounded to fp32 (0 where empty).
    One fp64 division a code, then products: an fp64 division is a long instruction sequence (64 of them per thread
    and block in this walk's sm_90a PTX when every cell divided); the product is within an fp64 ulp of the quotient,
    far below the fp32 rounding that follows."""
    inv = 1.0 / tl.maximum(cnt, 1.0)
    return (total * inv[:, None]).to(tl.float32)


@triton.jit
def _write_entry(
    items_ptr, n_ptr, n, r, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
):
    """Entry ``r``'s counts (by the first program of the codes) and, where an item reads it, means, in the items'
    dtype; returns the means in fp32."""
    tl.store(n_ptr + (n * (R + 1) + r) * S + s, cnt, mask=s_ok & first_program)
    mean = _mean(cnt, total)
    slot = r + 1 - FIRST  # the item of block r + 1, which reads entry r
    if (slot >= 0) & (slot < ITEMS):
        tl.store(
            items_ptr + (n * ITEMS + slot) * S * D + cell, mean.to(items_ptr.dtype.element_ty), mask=cell_ok
        )
    return mean


@triton.jit
def prefix_forward_kernel(
    sums_ptr, cnt_ptr, n0_ptr, mu0_ptr, n_ptr, items_ptr, state_ptr,
    R, S, D, FIRST, ITEMS, STATE,
    BS: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Grid ``(N, cdiv(S, BS), cdiv(D, BD))``, codes ``s``, columns ``d`` of sequence ``n``; entry ``0`` the carried
    state, entry ``r + 1`` it and blocks ``0..r`` (their sums and counts from :func:`block_sums_kernel`). Writes
    every entry's counts (fp64, by the programs of column block 0) and, of the means, the entries the ``ITEMS``
    items read (item ``i``, block ``FIRST + i``, reads entry ``max(FIRST + i - 1, 0)``), in the items' dtype, and
    entry ``STATE`` in fp32 (the carried state's). The running sums and counts are fp64, the means rounded to fp32
    first, as the reference's.

    The blocks are walked in two loops, up to entry ``STATE`` and after it, so that the state is written between
    them (a third store inside one loop took 70 more registers a thread when the loop also summed the blocks)."""
    n, sb, db = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    s = sb * BS + tl.arange(0, BS)
    s_ok = s < S
    d = db * BD + tl.arange(0, BD)
    cell = s[:, None] * D + d[None, :]  # of one sequence's (S, D) means
    cell_ok = s_ok[:, None] & (d < D)[None, :]
    cnt = tl.load(n0_ptr + n * S + s, mask=s_ok, other=0.0)
    mu0 = tl.load(mu0_ptr + n * S * D + cell, mask=cell_ok, other=0.0)
    total = cnt[:, None] * mu0.to(tl.float64)
    first_program = db == 0  # of the codes': it writes their counts
    mean = _write_entry(
        items_ptr, n_ptr, n, 0, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
    )
    if (FIRST == 0) & (ITEMS > 0):  # block 0 reads entry 0 as well
        tl.store(items_ptr + n * ITEMS * S * D + cell, mean.to(items_ptr.dtype.element_ty), mask=cell_ok)
    for r in range(1, STATE + 1):  # entry r adds block r - 1
        cnt, total = _add_block(sums_ptr, cnt_ptr, n, r - 1, s, s_ok, cell, cell_ok, R, S, D, cnt, total)
        _write_entry(
            items_ptr, n_ptr, n, r, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
        )
    tl.store(state_ptr + n * S * D + cell, _mean(cnt, total), mask=cell_ok)
    for r in range(STATE + 1, R + 1):
        cnt, total = _add_block(sums_ptr, cnt_ptr, n, r - 1, s, s_ok, cell, cell_ok, R, S, D, cnt, total)
        _write_entry(
            items_ptr, n_ptr, n, r, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
        )


@triton.jit
def prefix_backward_kernel(
    g_ptr, n_ptr, suffix_ptr,
    R, S, D, FIRST, ITEMS,
    BS: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Grid ``(N, cdiv(S, BS), cdiv(D, BD))``: for each block ``r``, the rows ``s``, columns ``d`` of
    ``Σ_{j > r} g[j, s] / n[j, s]`` (into ``suffix (N, R, S, D)``, in its dtype), carried in fp32 from the last
    block back. ``g[j]`` is the gradient of the item that reads entry ``j`` (the forward's items, any float dtype;
    zero for an entry no item reads; entry 0, which two items may read, feeds no value)."""
    n, sb, db = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    s = sb * BS + tl.arange(0, BS)
    s_ok = s < S
    d = db * BD + tl.arange(0, BD)
    cell = s[:, None] * D + d[None, :]
    cell_ok = s_ok[:, None] & (d < D)[None, :]
    suffix = tl.full([BS, BD], 0.0, tl.float32)
    for rr in range(0, R):
        r = R - 1 - rr  # block r feeds entries r + 1 .. R
        cnt = tl.load(n_ptr + (n * (R + 1) + r + 1) * S + s, mask=s_ok, other=0.0).to(tl.float32)
        slot = r + 2 - FIRST  # the item of block r + 2, which reads entry r + 1
        if (slot >= 0) & (slot < ITEMS):
            g = tl.load(g_ptr + (n * ITEMS + slot) * S * D + cell, mask=cell_ok, other=0.0).to(tl.float32)
            suffix += tl.where(cnt[:, None] > 0, g / tl.maximum(cnt, 1.0)[:, None], 0.0)
        tl.store(
            suffix_ptr + (n * R + r) * S * D + cell, suffix.to(suffix_ptr.dtype.element_ty), mask=cell_ok
        )


@triton.jit
def code_rows_kernel(
    suffix_ptr, z_ptr, dv_ptr,
    R, L, S, D, HK, STRIDE_B, STRIDE_H, STRIDE_T,
    BT: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Grid ``(N·R, cdiv(L, BT), cdiv(D, BD))``: the values' gradient ``dv`` (where it lies, as the forward's values)
    of positions ``t`` of block ``r`` of sequence ``n``, columns ``d``: the row of its code in the block's suffix sums
    (0 where padded)."""
    nr, tb, db = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n, r = nr // R, nr % R
    t = tb * BT + tl.arange(0, BT)
    t_ok = t < L
    d = db * BD + tl.arange(0, BD)
    d_ok = d < D
    z = _codes(z_ptr, n, r, t, t_ok, R, L)
    row = tl.load(suffix_ptr + (nr * S + z)[:, None] * D + d[None, :], mask=(z >= 0)[:, None] & d_ok[None, :],
                  other=0.0)  # fmt: skip
    row0 = _first_row(n, r, L, HK, STRIDE_B, STRIDE_H, STRIDE_T)
    tl.store(dv_ptr + (row0 + t * STRIDE_T)[:, None] * D + d[None, :], row.to(dv_ptr.dtype.element_ty),
             mask=t_ok[:, None] & d_ok[None, :])  # fmt: skip
