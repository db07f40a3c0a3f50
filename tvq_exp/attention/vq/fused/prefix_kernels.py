"""The Triton kernels of the cache's running code means (see :mod:`.prefix` for the algorithm).

Loaded by :func:`tvq_exp.attention.vq.fused.prefix.prefix_kernels` (never imported directly), once per mode: compiled,
or interpreted on the CPU.

Names: ``n`` the sequence, ``r`` a block of ``L`` positions ``t``, ``s`` a code, ``d`` a value column. Each program
holds ``BS`` codes by ``BD`` columns and walks the blocks in order (the forward) or in reverse (the backward). A
block's per-code sums are one product: the one-hot ``(BS, BT)`` of the positions' codes times their values
``(BT, BD)``, exact products (0 or 1 times a value) summed in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _codes(z_ptr, ok_ptr, n, r, t, t_ok, R, L):
    """The codes of positions ``t`` of block ``r`` of sequence ``n``, ``-1`` where padded (not counted)."""
    z = tl.load(z_ptr + (n * R + r) * L + t, mask=t_ok, other=-1)
    keep = tl.load(ok_ptr + r * L + t, mask=t_ok, other=0)
    return tl.where(keep != 0, z, -1)


@triton.jit
def _add_block(z_ptr, v_ptr, ok_ptr, n, r, s, d, R, L, D, cnt, total, BS, BT, BD, DOT, PREC):
    """The running counts ``(BS,)`` and sums ``(BS, BD)`` (fp64) of codes ``s``, columns ``d``, with block ``r`` of
    sequence ``n`` added: its per-code sums one product per ``BT`` positions, fp32."""
    block = tl.full([BS, BD], 0.0, tl.float32)
    block_n = tl.full([BS], 0.0, tl.float32)
    for t0 in range(0, L, BT):
        t = t0 + tl.arange(0, BT)
        t_ok = t < L
        z = _codes(z_ptr, ok_ptr, n, r, t, t_ok, R, L)
        hit = tl.where(s[:, None] == z[None, :], 1.0, 0.0)  # (BS, BT)
        v = tl.load(v_ptr + ((n * R + r) * L + t)[:, None] * D + d[None, :],
                    mask=t_ok[:, None] & (d < D)[None, :], other=0.0)  # fmt: skip
        block += tl.dot(hit.to(DOT), v.to(DOT), input_precision=PREC)
        block_n += tl.reduce(hit, 1, tl.standard._sum_combine)
    return cnt + block_n.to(tl.float64), total + block.to(tl.float64)


@triton.jit
def _mean(cnt, total):
    """The means ``(BS, BD)`` of running sums ``total`` over counts ``cnt`` (fp64), rounded to fp32 (0 where empty)."""
    return (total / tl.maximum(cnt, 1.0)[:, None]).to(tl.float32)


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
    z_ptr, v_ptr, ok_ptr, n0_ptr, mu0_ptr, n_ptr, items_ptr, state_ptr,
    R, L, S, D, FIRST, ITEMS, STATE,
    BS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(N, cdiv(S, BS), cdiv(D, BD))``, codes ``s``, columns ``d`` of sequence ``n``; entry ``0`` the carried
    state, entry ``r + 1`` it and blocks ``0..r``. Writes every entry's counts (fp64, by the programs of column
    block 0) and, of the means, the entries the ``ITEMS`` items read (item ``i``, block ``FIRST + i``, reads entry
    ``max(FIRST + i - 1, 0)``), in the items' dtype, and entry ``STATE`` in fp32 (the carried state's). The running
    sums and counts are fp64, the means rounded to fp32 first, as the reference's.

    The blocks are walked in two loops, up to entry ``STATE`` and after it, so that the state is written between
    them: a third store inside one loop took 70 more registers a thread (242, bf16 values, sm_90a)."""
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
        cnt, total = _add_block(
            z_ptr, v_ptr, ok_ptr, n, r - 1, s, d, R, L, D, cnt, total, BS, BT, BD, DOT, PREC
        )
        _write_entry(
            items_ptr, n_ptr, n, r, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
        )
    tl.store(state_ptr + n * S * D + cell, _mean(cnt, total), mask=cell_ok)
    for r in range(STATE + 1, R + 1):
        cnt, total = _add_block(
            z_ptr, v_ptr, ok_ptr, n, r - 1, s, d, R, L, D, cnt, total, BS, BT, BD, DOT, PREC
        )
        _write_entry(
            items_ptr, n_ptr, n, r, s, s_ok, cell, cell_ok, first_program, cnt, total, R, S, D, FIRST, ITEMS
        )


@triton.jit
def prefix_backward_kernel(
    g_ptr, n_ptr, z_ptr, ok_ptr, dv_ptr,
    R, L, S, D, FIRST, ITEMS,
    BS: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(N, cdiv(S, BS), cdiv(D, BD))``: the values' gradient, columns ``d``, of the positions whose code is one
    of ``s`` (padding: where its code falls; written 0): ``Σ_{j > r} g[j, z_t] / n[j, z_t]`` for a position of block
    ``r``, the suffix over the entries carried in fp32 from the last block back. ``g[j]`` is the gradient of the
    item that reads entry ``j`` (the forward's items, any float dtype; zero for an entry no item reads; entry 0,
    which two items may read, feeds no value). Each position is written by the one program of its code: no
    atomics."""
    n, sb, db = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    s = sb * BS + tl.arange(0, BS)
    s_ok = s < S
    d = db * BD + tl.arange(0, BD)
    d_ok = d < D
    suffix = tl.full([BS, BD], 0.0, tl.float32)
    for rr in range(0, R):
        r = R - 1 - rr  # block r feeds entries r + 1 .. R
        entry = n * (R + 1) + r + 1
        cnt = tl.load(n_ptr + entry * S + s, mask=s_ok, other=0.0).to(tl.float32)
        slot = r + 2 - FIRST  # the item of block r + 2, which reads entry r + 1
        if (slot >= 0) & (slot < ITEMS):
            g = tl.load(g_ptr + ((n * ITEMS + slot) * S + s)[:, None] * D + d[None, :],
                        mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
            suffix += tl.where(cnt[:, None] > 0, g / tl.maximum(cnt, 1.0)[:, None], 0.0)
        for t0 in range(0, L, BT):
            t = t0 + tl.arange(0, BT)
            t_ok = t < L
            z = tl.load(z_ptr + (n * R + r) * L + t, mask=t_ok, other=-1)
            keep = tl.load(ok_ptr + r * L + t, mask=t_ok, other=0)
            hit = tl.where(z[:, None] == s[None, :], 1.0, 0.0)  # (BT, BS)
            dv = tl.dot(hit, suffix, input_precision=PREC)
            dv = tl.where(keep[:, None] != 0, dv, 0.0)
            mine = t_ok & (z >= sb * BS) & (z < sb * BS + BS)
            tl.store(dv_ptr + ((n * R + r) * L + t)[:, None] * D + d[None, :], dv.to(dv_ptr.dtype.element_ty),
                     mask=mine[:, None] & d_ok[None, :])  # fmt: skip
