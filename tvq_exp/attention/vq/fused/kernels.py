"""The Triton kernels of the fused window + cache step (see :mod:`.op` for the layout and the algorithm).

Over 300 lines: one forward and three backward kernels (and the backward's row term) sharing their tile steps;
splitting them would scatter one algorithm over several files.

Loaded by :func:`tvq_exp.attention.vq.fused.support.kernels` (never imported directly): Triton reads
``TRITON_INTERPRET`` when a kernel is decorated, so the module is loaded once per mode (compiled, or
interpreted on the CPU).

Names: ``n`` the sequence (batch ``n // HK`` × key head ``n % HK``), ``i`` the item (query block), ``r`` a query row
of the item (``R = G·Lq`` rows, row ``r = g·Lq + p``: head ``g``, position ``p``), ``j`` a window key (``W =
blocks·L``; key ``j`` of item ``i`` is key ``(i - shift)·L + j`` of the sequence's blocks, which are cut from one time
axis; ``shift`` is 1 where the key blocks leave out item 0's masked previous block, which no kernel reads, else 0),
``c`` a code. Rows are addressed by unit strides (element strides over the row's width, :mod:`.op`): the queries'
``sq_b, sq_h, sq_i, sq_g, sq_p`` (batch, key head, item, head, position), which are also the outputs', ``dO``'s,
``dq``'s, ``lse``'s, the row term's and the distance logits' (all dense in one order); the keys' ``sk_b, sk_h, sk_t``
(batch, key head, key), which are also the values', and the keys' and values' gradients' ``sg_*``; so ``(B, T, H,
d)`` memory seen as ``(B, H, T, d)`` is read as it is. The codes, their log counts and means are contiguous (flat rows).
Scores are kept in base 2 (``s·log2 e``), the cache's log counts come in base 2 (``ln_ptr``: ``log2 n``), and
``lse`` is ``log2 Σ 2^s``. Row ``p`` and window key ``j`` are ``d = FIRST + p - j`` apart
(:class:`~tvq_exp.attention.vq.kernel.WindowIndex`): the key is visible for ``0 <= d <= SPAN``, and its term is
the row's distance logit ``min(d, M1)`` when that is ``< M1``, else zero. ``M1`` is the number of XL-bias distances
(``M + 1``; 0 without the bias, ``HAS_BIAS`` False). Computed, not looked up: no table is read in the key loops, and
the tiles to visit come from the same arithmetic. Without the bias, and with whole key tiles (``WHOLE``), the tiles
every row of a row block sees (every key of a key tile, in the keys' gradient) run in a loop of their own with no
mask computed, after one over the masked ones (:func:`_masked_step`): most of the window, and a fifth to a third fewer instructions per tile in the compiled code
(docs/benchmarks.md). Where every tile a kernel's loops load is whole (``EVEN``: key and code tiles in the forward and
``dq``, row blocks in the keys' and codes' gradients; value chunks whole, ``d_k`` unpadded) they load without masks;
where the forward's and ``dq``'s are also whole tiles without the bias, through tensor descriptors (``TMA``:
:func:`_tile`; on the GPU the tensor-memory accelerator's bulk copies).
Every dot takes ``DOT`` operands (fp32 under the interpreter or for fp32 inputs,
else bf16/fp16) and accumulates in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


# Only Triton's builtins and this module's functions are called: the standard library's jit functions (``tl.max``,
# ``tl.sum``, ``tl.zeros``, ``tl.cdiv``) take the mode Triton was first imported in, so one process could not run
# these kernels both interpreted and compiled. The row reductions name the standard combine functions, which the
# interpreter recognises (numpy) without calling them and the compiler inlines.
@triton.jit
def _row_max(x):
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@triton.jit
def _row_sum(x):
    return tl.reduce(x, 1, tl.standard._sum_combine)


@triton.jit
def _load(ptr, rows_ok, cols_ok, EVEN: tl.constexpr):
    """The tile at ``ptr`` (zeros where a row or a column is out of range); where ``EVEN`` (every row and column in
    range) no mask is computed or applied."""
    if EVEN:
        return tl.load(ptr)
    return tl.load(ptr, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def _load_vector(ptr, ok, other, EVEN: tl.constexpr):
    """The vector at ``ptr`` (``other`` where out of range); unmasked where ``EVEN`` (every element in range)."""
    if EVEN:
        return tl.load(ptr)
    return tl.load(ptr, mask=ok, other=other)


@triton.jit
def _tile(desc, row0, col0, ptr, rows_ok, cols_ok, EVEN: tl.constexpr, TMA: tl.constexpr):
    """A tile of consecutive rows from ``row0``, columns from ``col0``: through its tensor descriptor ``desc`` (the
    tensor-memory accelerator's bulk copy on the GPU; ``TMA``: the tile is whole) or by its pointers ``ptr``
    (:func:`_load`; the pointers are not computed where ``TMA``)."""
    if TMA:
        return desc.load([row0, col0])
    return _load(ptr, rows_ok, cols_ok, EVEN)


@triton.jit
def _row_block(pb, NPB, Lq, BM: tl.constexpr):
    """Row block ``pb`` of an item: its head ``g = pb // NPB``, its block ``pp = pb % NPB`` of the head's positions,
    the positions ``p`` and which are in range."""
    g, pp = pb // NPB, pb % NPB
    p = pp * BM + tl.arange(0, BM)
    return g, pp, p, p < Lq


@triton.jit
def _units(n, HK, s_b, s_h):
    """Where sequence ``n`` (batch ``n // HK``, key head ``n % HK``) starts in a tensor of rows, in rows of its width
    (its unit strides ``s_b``, ``s_h``: element strides over the width)."""
    return (n // HK) * s_b + (n % HK) * s_h


@triton.jit
def _base2(x, DOT: tl.constexpr):
    """``x·log2 e`` as ``DOT``: one side of a product scaled, its scores come out in base 2."""
    return (x.to(tl.float32) * LOG2E).to(DOT)


@triton.jit
def _queries(q_ptr, row, p_ok, dko, dk_ok, dk, DOT: tl.constexpr):
    """The queries of rows ``row`` (in rows of ``dk``) ``(BM, DK)`` scaled by ``log2 e`` (base-2 scores straight from
    the product), as ``DOT``."""
    q = tl.load(q_ptr + row[:, None] * dk + dko[None, :], mask=p_ok[:, None] & dk_ok[None, :], other=0.0)
    return _base2(q, DOT)


@triton.jit
def _visible_tiles(pp, i, prev_masked, Lq, L, W, TPB, FIRST, SPAN, BM: tl.constexpr, BN: tl.constexpr):
    """The window tiles ``[lo, hi)`` some row of row block ``pp`` of item ``i`` sees (:func:`_row_tiles`; item 0
    without a previous block: not its first block's)."""
    lo, hi = _row_tiles(pp, Lq, L, W, TPB, FIRST, SPAN, BM, BN)
    return tl.maximum(lo, TPB * ((prev_masked != 0) & (i == 0)).to(tl.int32)), hi


@triton.jit
def _key_tile(j, L, TPB, BN: tl.constexpr):
    """The window tile of window key ``j``: tile ``t`` of block half ``h`` is ``h·TPB + t``."""
    return (j // L) * TPB + (j % L) // BN


@triton.jit
def _row_tiles(pp, Lq, L, W, TPB, FIRST, SPAN, BM: tl.constexpr, BN: tl.constexpr):
    """The window tiles ``[lo, hi)`` some row of row block ``pp`` sees (keys ``FIRST + p - SPAN .. FIRST + p``)."""
    j_lo = tl.maximum(FIRST + pp * BM - SPAN, 0)
    j_hi = tl.minimum(FIRST + tl.minimum(pp * BM + BM, Lq) - 1, W - 1)
    lo = _key_tile(j_lo, L, TPB, BN)
    return lo, tl.where(j_hi >= j_lo, _key_tile(j_hi, L, TPB, BN) + 1, lo)


@triton.jit
def _distances(p, p_ok, j, j_ok, FIRST, SPAN):
    """Distances ``(len(p), len(j))`` of window keys ``j`` to rows ``p``, and which keys the rows see."""
    d = FIRST + p[:, None] - j[None, :]
    return d, p_ok[:, None] & j_ok[None, :] & (d >= 0) & (d <= SPAN)


@triton.jit
def _window_term(dl_ptr, dl_row, p, p_ok, j, j_ok, FIRST, SPAN, M1, HAS_BIAS: tl.constexpr):
    """The additive term ``(len(p), len(j))`` of window keys ``j`` for rows at positions ``p`` (fp32,
    ``-inf`` where masked): a visible key ``d < M1`` apart takes the row's distance logit ``d``, else zero;
    ``dl_row`` the rows' offsets into the distance logits."""
    d, ok = _distances(p, p_ok, j, j_ok, FIRST, SPAN)
    if HAS_BIAS:
        term = tl.load(dl_ptr + dl_row[:, None] + d, mask=ok & (d < M1), other=0.0)
    else:
        term = tl.full(d.shape, 0.0, tl.float32)
    return tl.where(ok, term, float("-inf"))


@triton.jit
def _whole_tiles(pp, lo, hi, Lq, W, FIRST, SPAN, BM: tl.constexpr, BN: tl.constexpr):
    """The window tiles ``[a, b)`` of ``[lo, hi)`` that every row of row block ``pp`` sees whole (keys ``FIRST +
    p_last - SPAN .. FIRST + p_first``), for ``L`` a multiple of ``BN`` (window key ``j`` is in tile ``j // BN``, and
    every tile holds ``BN`` keys); the rest of ``[lo, hi)`` is masked, before ``a`` and from ``b``."""
    p_last = tl.minimum(pp * BM + BM, Lq) - 1
    a = (tl.maximum(FIRST + p_last - SPAN, 0) + BN - 1) // BN
    b = (tl.minimum(FIRST + pp * BM, W - 1) + 1) // BN
    a = tl.minimum(tl.maximum(a, lo), hi)
    return a, tl.minimum(tl.maximum(b, a), hi)


@triton.jit
def _masked_step(i, lo, a, b, WHOLE: tl.constexpr):
    """The ``i``-th of a loop's masked steps: those of ``[lo, a)``, then those of ``[b, hi)``, where ``[a, b)`` are the
    whole ones (``WHOLE``; else every step is masked, ``lo + i``). One loop over both masked runs, a second over the
    whole ones: two pipelined loops, not three (the keys' gradient compiles at 32 rows a step without spills under
    Triton 3.6 so)."""
    if WHOLE:
        return tl.where(i < a - lo, lo + i, b + i - (a - lo))
    return lo + i


@triton.jit
def _window_scores(q, k, dl_ptr, dl_row, p, p_ok, j, j_ok, FIRST, SPAN, M1,
                   HAS_BIAS: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Base-2 scores ``(len(p), len(j))`` of the rows' queries ``q`` (scaled by ``log2 e``) with window keys ``k``, their
    term added (:func:`_window_term`). ``MASKED`` False: a whole tile without the XL bias (:func:`_whole_tiles`),
    every key visible to every row: the product alone."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if MASKED:
        s += _window_term(dl_ptr, dl_row, p, p_ok, j, j_ok, FIRST, SPAN, M1, HAS_BIAS) * LOG2E
    return s


@triton.jit
def _online_step(m_i, l_i, acc, s, v, DOT: tl.constexpr, PREC: tl.constexpr):
    """One online-softmax step: base-2 scores ``s (BM, BN)`` with values ``v (BN, BDV)``."""
    m_new = tl.maximum(m_i, _row_max(s))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + _row_sum(p)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _keys(k_head, sk_t, kt0, TMA: tl.constexpr):
    """A sequence's window keys (and values: they share the keys' rows): the row of window key ``j`` is ``base +
    j·sk_t`` (from the sequence's start ``k_head``, key rows ``sk_t`` apart, window key 0 at key ``kt0`` of its
    blocks), and, ``TMA``, its tiles' descriptor coordinates ``(row0 + j, unit·d)`` (the descriptor's rows are ``sk_t``
    rows wide: :meth:`_Layout.descriptors`; else zeros, unused)."""
    if TMA:
        return k_head + kt0 * sk_t, k_head // sk_t + kt0, k_head % sk_t
    return k_head + kt0 * sk_t, 0, 0


@triton.jit
def _forward_tile(q, m_i, l_i, acc, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, k_base, sk_t, k_row0, k_unit, row,
                  p, p_ok, dko, dk_ok, dv0, dvo, dv_ok, L, TPB, FIRST, SPAN, M1,
                  dk, dv, BN: tl.constexpr, HAS_BIAS: tl.constexpr, MASKED: tl.constexpr, EVEN: tl.constexpr,
                  TMA: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """The forward's online-softmax step over window tile ``wt`` (tile ``t`` of block half ``h``; value columns
    ``dvo``, from ``dv0``); keys and values where :func:`_keys` puts them."""
    h, t = wt // TPB, wt % TPB
    jl = t * BN + tl.arange(0, BN)
    j_ok = jl < L
    j = h * L + jl
    j0 = h * L + t * BN  # the tile's first window key
    key_row = k_base + j * sk_t
    k = _tile(
        k_desc, k_row0 + j0, k_unit * dk, k_ptr + key_row[:, None] * dk + dko[None, :], j_ok, dk_ok, EVEN, TMA
    )
    s = _window_scores(
        q, k.to(DOT), dl_ptr, row * M1, p, p_ok, j, j_ok, FIRST, SPAN, M1, HAS_BIAS, MASKED, PREC
    )
    v = _tile(v_desc, k_row0 + j0, k_unit * dv + dv0, v_ptr + key_row[:, None] * dv + dvo[None, :], j_ok, dv_ok, EVEN,
              TMA)  # fmt: skip
    return _online_step(m_i, l_i, acc, s, v.to(DOT), DOT, PREC)


@triton.jit
def forward_kernel(
    q_ptr, k_ptr, v_ptr, dl_ptr, c_ptr, ln_ptr, mu_ptr, out_ptr, lse_ptr, k_desc, v_desc, c_desc, mu_desc,
    ITEMS, Lq, L, W, FIRST, SPAN, S, M1, dk, dv, code_seq_stride, code_item_stride, prev_masked,
    shift, NPB, TPB, HK: tl.constexpr, sq_b, sq_h, sq_i, sq_g, sq_p: tl.constexpr, sk_b, sk_h, sk_t: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr,
    HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr, WHOLE: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(G·NPB, ITEMS, N·NDV)``: ``BM`` rows of one head of item ``i``, values ``BDV`` wide (chunk ``dc``);
    writes ``out`` and (chunk 0) the rows' ``lse``. ``TMA``: the key, value, code and mean tiles come through their
    descriptors (``k_desc``, ``v_desc``, ``c_desc``, ``mu_desc``: rows of ``k_ptr``, ... ; else None). Rows by unit
    strides (:mod:`.op`): the queries' ``sq_*`` (also the outputs', ``lse``'s and the distance logits'), the keys'
    ``sk_*`` (also the values')."""
    tl.static_assert(not (WHOLE and HAS_BIAS), "whole tiles are taken without the XL bias")
    pb, i, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ndv = (dv + BDV - 1) // BDV
    n, dc = z // ndv, z % ndv
    g, pp, p, p_ok = _row_block(pb, NPB, Lq, BM)
    row = _units(n, HK, sq_b, sq_h) + i * sq_i + g * sq_g + p * sq_p  # of the queries, outputs, lse, logits
    dko, dvo = tl.arange(0, DK), dc * BDV + tl.arange(0, BDV)
    dk_ok, dv_ok = dko < dk, dvo < dv
    q = _queries(q_ptr, row, p_ok, dko, dk_ok, dk, DOT)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, BDV], 0.0, tl.float32)
    kt0 = (i - shift) * L  # window key j is key kt0 + j of the sequence's blocks
    k_base, k_row0, k_unit = _keys(_units(n, HK, sk_b, sk_h), sk_t, kt0, TMA)
    lo, hi = _visible_tiles(pp, i, prev_masked, Lq, L, W, TPB, FIRST, SPAN, BM, BN)
    # the masked tiles (before and after the whole ones) in one loop, then the whole ones without a mask (WHOLE);
    # else every tile masked
    a, b = hi, hi
    if WHOLE:
        a, b = _whole_tiles(pp, lo, hi, Lq, W, FIRST, SPAN, BM, BN)
    for step in range(0, a - lo + hi - b):
        wt = _masked_step(step, lo, a, b, WHOLE)
        m_i, l_i, acc = _forward_tile(q, m_i, l_i, acc, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, k_base, sk_t,
                                      k_row0, k_unit, row, p, p_ok, dko, dk_ok, dc * BDV,
                                      dvo, dv_ok, L, TPB, FIRST, SPAN, M1, dk, dv, BN, HAS_BIAS, True, EVEN, TMA, DOT,
                                      PREC)  # fmt: skip
    if WHOLE:
        for wt in range(a, b):
            m_i, l_i, acc = _forward_tile(q, m_i, l_i, acc, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, k_base, sk_t,
                                          k_row0, k_unit, row, p, p_ok, dko, dk_ok,
                                          dc * BDV, dvo, dv_ok, L, TPB, FIRST, SPAN, M1, dk, dv, BN, HAS_BIAS, False,
                                          EVEN, TMA, DOT, PREC)  # fmt: skip
    if HAS_CACHE:
        # the item's codebook: from element code0, row code0 / dk
        item = n * ITEMS + i  # here, where the cache reads it: not held over the window's loops
        code0 = n * code_seq_stride + i * code_item_stride
        code_row0 = code0 // dk
        for c0 in range(0, S, BN):
            c = c0 + tl.arange(0, BN)
            c_ok = c < S
            code = _tile(c_desc, code_row0 + c0, 0, c_ptr + code0 + c[:, None] * dk + dko[None, :], c_ok, dk_ok, EVEN,
                         TMA)  # fmt: skip
            log_n = _load_vector(ln_ptr + item * S + c, c_ok, float("-inf"), EVEN)
            s = tl.dot(q, tl.trans(code.to(DOT)), input_precision=PREC) + log_n[None, :]  # both in base 2
            mu = _tile(mu_desc, item * S + c0, dc * BDV, mu_ptr + (item * S + c)[:, None] * dv + dvo[None, :], c_ok,
                       dv_ok, EVEN, TMA)  # fmt: skip
            m_i, l_i, acc = _online_step(m_i, l_i, acc, s, mu.to(DOT), DOT, PREC)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(out_ptr + row[:, None] * dv + dvo[None, :], out.to(out_ptr.dtype.element_ty),
             mask=p_ok[:, None] & dv_ok[None, :])  # fmt: skip
    tl.store(lse_ptr + row, m_i + tl.log2(l_safe), mask=p_ok & (dc == 0))


@triton.jit
def delta_kernel(do_ptr, o_ptr, delta_ptr, ROWS, D, BM: tl.constexpr, BD: tl.constexpr):
    """Grid ``(cdiv(ROWS, BM),)``: the backward kernels' row term ``Σ_d dO·O`` of ``ROWS`` rows of ``D`` values
    (FlashAttention-2's preprocessing), both read once, products and sums in fp32."""
    row = tl.program_id(0) * BM + tl.arange(0, BM)
    ok = row < ROWS
    acc = tl.full([BM], 0.0, tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + tl.arange(0, BD)
        cell = row[:, None] * D + d[None, :]
        m = ok[:, None] & (d < D)[None, :]
        do = tl.load(do_ptr + cell, mask=m, other=0.0).to(tl.float32)
        o = tl.load(o_ptr + cell, mask=m, other=0.0).to(tl.float32)
        acc += _row_sum(do * o)
    tl.store(delta_ptr + row, acc, mask=ok)


@triton.jit
def _dp(do, do_ptr, v_ptr, v_desc, row, p_ok, tma_row, tma_col, key_row, key_ok, dv,
        BM: tl.constexpr, BN: tl.constexpr, BDV: tl.constexpr, ONE_CHUNK: tl.constexpr, EVEN: tl.constexpr,
        TMA: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``dO·v^T (BM, BN)`` over all of ``d_v`` (the values' rows ``key_row``; their tile at ``(tma_row, tma_col)`` of
    ``v_desc``; ``dO``'s rows ``row``): with the loaded ``do`` (one chunk; the values through ``v_desc`` where
    ``TMA``) or chunk by chunk."""
    if ONE_CHUNK:
        dvo = tl.arange(0, BDV)
        v = _tile(
            v_desc,
            tma_row,
            tma_col,
            v_ptr + key_row[:, None] * dv + dvo[None, :],
            key_ok,
            dvo < dv,
            EVEN,
            TMA,
        )
        return tl.dot(do, tl.trans(v.to(DOT)), input_precision=PREC)
    dp = tl.full([BM, BN], 0.0, tl.float32)
    for d0 in range(0, dv, BDV):
        dvo = d0 + tl.arange(0, BDV)
        d_ok = dvo < dv
        do_c = tl.load(
            do_ptr + row[:, None] * dv + dvo[None, :], mask=p_ok[:, None] & d_ok[None, :], other=0.0
        )
        v = _load(v_ptr + key_row[:, None] * dv + dvo[None, :], key_ok, d_ok, EVEN)
        dp += tl.dot(do_c.to(DOT), tl.trans(v.to(DOT)), input_precision=PREC)
    return dp


@triton.jit
def _dq_tile(dq, q, do, lse, delta, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, do_ptr, ddl_ptr, k_base, sk_t, k_row0,
             k_unit, row, p, p_ok, dko, dk_ok, L, TPB, FIRST, SPAN, M1, dk, dv,
             BM: tl.constexpr, BN: tl.constexpr, BDV: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
             ONE_CHUNK: tl.constexpr, MASKED: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr,
             DOT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``dq`` plus window tile ``wt``'s part, and that tile's distance-logit gradients written (keys and values where
    :func:`_keys` puts them)."""
    h, t = wt // TPB, wt % TPB
    jl = t * BN + tl.arange(0, BN)
    j_ok = jl < L
    j = h * L + jl
    j0 = h * L + t * BN  # the tile's first window key
    key_row = k_base + j * sk_t
    k = _tile(k_desc, k_row0 + j0, k_unit * dk, k_ptr + key_row[:, None] * dk + dko[None, :], j_ok, dk_ok, EVEN,
              TMA).to(DOT)  # fmt: skip
    s = _window_scores(q, k, dl_ptr, row * M1, p, p_ok, j, j_ok, FIRST, SPAN, M1, HAS_BIAS, MASKED, PREC)
    pr = tl.exp2(s - lse[:, None])
    dp = _dp(do, do_ptr, v_ptr, v_desc, row, p_ok, k_row0 + j0, k_unit * dv, key_row, j_ok, dv, BM, BN, BDV, ONE_CHUNK,
             EVEN, TMA, DOT, PREC)  # fmt: skip
    ds = pr * (dp - delta[:, None])
    if BIAS_GRAD:  # the visible keys inside the bias window: recomputed, not held over the products
        dist, seen = _distances(p, p_ok, j, j_ok, FIRST, SPAN)
        tl.store(ddl_ptr + (row * M1)[:, None] + dist, ds, mask=seen & (dist < M1))
    return dq + tl.dot(ds.to(DOT), k, input_precision=PREC)


@triton.jit
def dq_kernel(
    q_ptr, k_ptr, v_ptr, dl_ptr, c_ptr, ln_ptr, mu_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, ddl_ptr,
    k_desc, v_desc, c_desc, mu_desc,
    ITEMS, Lq, L, W, FIRST, SPAN, S, M1, dk, dv, code_seq_stride, code_item_stride, prev_masked,
    shift, NPB, TPB, HK: tl.constexpr, sq_b, sq_h, sq_i, sq_g, sq_p: tl.constexpr, sk_b, sk_h, sk_t: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr,
    HAS_CACHE: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, ONE_CHUNK: tl.constexpr,
    WHOLE: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(G·NPB, ITEMS, N)``: ``dq`` of ``BM`` rows of one head of item ``i`` and the gradient of their distance
    logits (``ddl``, each column written by the one key at that distance: no atomics). ``TMA``: as the forward's (the
    values and means through theirs in one chunk only). Rows as the forward's: ``dO``, ``dq``, ``lse`` and the row term
    by the outputs' unit strides."""
    tl.static_assert(not (WHOLE and HAS_BIAS), "whole tiles are taken without the XL bias")
    pb, i, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, pp, p, p_ok = _row_block(pb, NPB, Lq, BM)
    row = _units(n, HK, sq_b, sq_h) + i * sq_i + g * sq_g + p * sq_p  # of the queries, outputs, lse, logits
    dko = tl.arange(0, DK)
    dk_ok = dko < dk
    q = _queries(q_ptr, row, p_ok, dko, dk_ok, dk, DOT)
    lse = tl.load(lse_ptr + row, mask=p_ok, other=0.0)
    delta = tl.load(delta_ptr + row, mask=p_ok, other=0.0)
    dvo = tl.arange(0, BDV)
    do = tl.load(
        do_ptr + row[:, None] * dv + dvo[None, :], mask=p_ok[:, None] & (dvo < dv)[None, :], other=0.0
    )
    do = do.to(DOT)
    dq = tl.full([BM, DK], 0.0, tl.float32)
    kt0 = (i - shift) * L
    k_base, k_row0, k_unit = _keys(_units(n, HK, sk_b, sk_h), sk_t, kt0, TMA)
    lo, hi = _visible_tiles(pp, i, prev_masked, Lq, L, W, TPB, FIRST, SPAN, BM, BN)
    a, b = hi, hi  # as the forward: the masked tiles, then the whole ones
    if WHOLE:
        a, b = _whole_tiles(pp, lo, hi, Lq, W, FIRST, SPAN, BM, BN)
    for step in range(0, a - lo + hi - b):
        wt = _masked_step(step, lo, a, b, WHOLE)
        dq = _dq_tile(dq, q, do, lse, delta, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, do_ptr, ddl_ptr, k_base, sk_t,
                      k_row0, k_unit, row, p, p_ok, dko, dk_ok, L, TPB, FIRST,
                      SPAN, M1, dk, dv, BM, BN, BDV, HAS_BIAS, BIAS_GRAD, ONE_CHUNK, True, EVEN, TMA, DOT,
                      PREC)  # fmt: skip
    if WHOLE:
        for wt in range(a, b):
            dq = _dq_tile(dq, q, do, lse, delta, wt, k_ptr, v_ptr, k_desc, v_desc, dl_ptr, do_ptr, ddl_ptr, k_base,
                          sk_t, k_row0, k_unit, row, p, p_ok, dko, dk_ok, L, TPB,
                          FIRST, SPAN, M1, dk, dv, BM, BN, BDV, HAS_BIAS, BIAS_GRAD, ONE_CHUNK, False, EVEN, TMA, DOT,
                          PREC)  # fmt: skip
    if HAS_CACHE:
        item = n * ITEMS + i
        code0 = n * code_seq_stride + i * code_item_stride  # as the forward's
        code_row0 = code0 // dk
        for c0 in range(0, S, BN):
            c = c0 + tl.arange(0, BN)
            c_ok = c < S
            code = _tile(c_desc, code_row0 + c0, 0, c_ptr + code0 + c[:, None] * dk + dko[None, :], c_ok, dk_ok, EVEN,
                         TMA).to(DOT)  # fmt: skip
            log_n = _load_vector(ln_ptr + item * S + c, c_ok, float("-inf"), EVEN)
            s = tl.dot(q, tl.trans(code), input_precision=PREC) + log_n[None, :]
            pr = tl.exp2(s - lse[:, None])
            dp = _dp(do, do_ptr, mu_ptr, mu_desc, row, p_ok, item * S + c0, 0, item * S + c, c_ok, dv, BM, BN, BDV,
                     ONE_CHUNK, EVEN, TMA, DOT, PREC)  # fmt: skip
            ds = pr * (dp - delta[:, None])
            dq += tl.dot(ds.to(DOT), code, input_precision=PREC)
    tl.store(dq_ptr + row[:, None] * dk + dko[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=p_ok[:, None] & dk_ok[None, :])  # fmt: skip


@triton.jit
def _window_term_t(dl_ptr, dl_row, p, p_ok, j, j_ok, FIRST, SPAN, M1, HAS_BIAS: tl.constexpr):
    """:func:`_window_term` transposed: ``(len(j), len(p))``, without the columns."""
    d = FIRST + p[None, :] - j[:, None]
    ok = j_ok[:, None] & p_ok[None, :] & (d >= 0) & (d <= SPAN)
    if HAS_BIAS:
        term = tl.load(dl_ptr + dl_row[None, :] + d, mask=ok & (d < M1), other=0.0)
    else:
        term = tl.full(d.shape, 0.0, tl.float32)
    return tl.where(ok, term, float("-inf"))


@triton.jit
def _key_tile_grads(
    dk_acc, dv_acc, k, v, key_row, key_ok, term_t, q_ptr, do_ptr, lse_ptr, delta_ptr, v_ptr,
    row, p_ok, dk, dv, dv0,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr, ONE_CHUNK: tl.constexpr,
    DO_DK: tl.constexpr, DO_DV: tl.constexpr, HAS_TERM: tl.constexpr, EVEN: tl.constexpr, DOT: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Add the gradients that ``BM`` query rows give ``BN`` keys ``k`` (``DOT``, scaled by ``log2 e``: the scores come
    out in base 2, and the rows' queries go to both their products as loaded) and their values (chunk ``dv0``,
    ``v`` when it is all of ``d_v``): the probabilities transposed ``(BN, BM)``, recomputed from the rows' ``lse``;
    the scores' additive ``term_t`` (base 2) where ``HAS_TERM``. ``EVEN``: the rows are whole (and the heads
    unpadded): their loads take no mask. The rows' queries, ``dO``, ``lse`` and row term are at ``row``; the values'
    rows (``v_ptr``, chunk by chunk) at ``key_row``."""
    dko = tl.arange(0, DK)
    q = _load(q_ptr + row[:, None] * dk + dko[None, :], p_ok, dko < dk, EVEN).to(DOT)
    lse = _load_vector(lse_ptr + row, p_ok, float("inf"), EVEN)
    s_t = tl.dot(k, tl.trans(q), input_precision=PREC)  # k in base 2: q goes to the product as it was loaded
    if HAS_TERM:
        s_t += term_t
    p_t = tl.exp2(s_t - lse[None, :])
    if ONE_CHUNK or DO_DV:
        dvo = dv0 + tl.arange(0, BDV)
        do = _load(do_ptr + row[:, None] * dv + dvo[None, :], p_ok, dvo < dv, EVEN).to(DOT)
    if DO_DV:
        dv_acc += tl.dot(p_t.to(DOT), do, input_precision=PREC)
    if DO_DK:
        delta = _load_vector(delta_ptr + row, p_ok, 0.0, EVEN)
        if ONE_CHUNK:
            dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)
        else:
            dp_t = tl.full([BN, BM], 0.0, tl.float32)
            for d0 in range(0, dv, BDV):
                dvo = d0 + tl.arange(0, BDV)
                d_ok = dvo < dv
                do_c = _load(do_ptr + row[:, None] * dv + dvo[None, :], p_ok, d_ok, EVEN)
                v_c = tl.load(
                    v_ptr + key_row[:, None] * dv + dvo[None, :], mask=key_ok[:, None] & d_ok[None, :]
                )
                dp_t += tl.dot(v_c.to(DOT), tl.trans(do_c.to(DOT)), input_precision=PREC)
        ds_t = p_t * (dp_t - delta[None, :])
        dk_acc += tl.dot(ds_t.to(DOT), q, input_precision=PREC)
    return dk_acc, dv_acc


@triton.jit
def _store_tile(ptr, row0, step, rows, acc, cols, cols_ok, width, BN: tl.constexpr):
    """Store a gradient tile ``acc (BN, len(cols))`` at rows ``row0, row0 + step, ..`` (its first ``rows`` of them) of a
    tensor of rows ``width`` wide. Its addresses are made here from ``row0``: kept from before the loops, they took
    registers the whole kernel long (the compiled keys' gradient spilled them under Triton 3.6)."""
    r = tl.arange(0, BN)
    tl.store(ptr + (row0 + r * step)[:, None] * width + cols[None, :], acc.to(ptr.dtype.element_ty),
             mask=(r < rows)[:, None] & cols_ok[None, :])  # fmt: skip


@triton.jit
def _window_key_rows(
    dk_acc, dv_acc, pp, row0, sq_p, j, k, v, key_row, k_ok, q_ptr, do_ptr, lse_ptr, delta_ptr, v_ptr,
    dl_ptr, Lq, FIRST, SPAN, M1, dk, dv, dv0,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr, ONE_CHUNK: tl.constexpr,
    DO_DK: tl.constexpr, DO_DV: tl.constexpr, HAS_BIAS: tl.constexpr, MASKED: tl.constexpr, EVEN: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The gradients that row block ``pp`` (positions ``p``, rows ``row0 + p·sq_p``) gives window keys ``j``: masked
    (``MASKED``), or a block whose rows see every key, without the XL bias: no term."""
    p = pp * BM + tl.arange(0, BM)
    p_ok = p < Lq
    row = row0 + p * sq_p
    term_t = 0.0  # a whole block (no XL bias): no term
    if MASKED:
        term_t = _window_term_t(dl_ptr, row * M1, p, p_ok, j, k_ok, FIRST, SPAN, M1, HAS_BIAS) * LOG2E
    return _key_tile_grads(
        dk_acc, dv_acc, k, v, key_row, k_ok, term_t, q_ptr, do_ptr, lse_ptr, delta_ptr, v_ptr,
        row, p_ok, dk, dv, dv0, BM, BN, DK, BDV, ONE_CHUNK, DO_DK, DO_DV, MASKED, EVEN, DOT, PREC,
    )  # fmt: skip


@triton.jit
def window_key_kernel(
    q_ptr, k_ptr, v_ptr, dl_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    ITEMS, G, Lq, L, FIRST, SPAN, M1, dk, dv, prev_masked, shift, prev_grad, blocks,
    TPB, NDVG, HK: tl.constexpr, sq_b, sq_h, sq_i, sq_g, sq_p: tl.constexpr, sk_b, sk_h, sk_t: tl.constexpr, sg_b, sg_h,
    sg_t: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr, ONE_CHUNK: tl.constexpr,
    DO_DK: tl.constexpr, DO_DV: tl.constexpr, HAS_BIAS: tl.constexpr, WHOLE: tl.constexpr, EVEN: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(TPB·NDVG, IB, N)`` (``IB = ITEMS + blocks - 1 - shift``): the gradient of ``BN`` keys of key block ``b``
    (and of their values, chunk ``dc``) from the (at most two) items that see the block: item ``b + shift`` (block
    ``b`` is its previous block, window half 0; not without ``prev_grad``) and item ``b + shift - 1`` (its own block,
    half 1). Every key block is written by its programs only: no atomics. Rows by unit strides, as the forward's; the
    keys' and values' gradients by theirs, ``sg_*``."""
    tl.static_assert(not (WHOLE and HAS_BIAS), "whole tiles are taken without the XL bias")
    z, b, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t, dc = z // NDVG, z % NDVG
    kl = t * BN + tl.arange(0, BN)
    k_ok = kl < L
    kt = b * L + kl  # the tile's keys in the sequence's blocks
    seq, head = n // HK, n % HK  # once: the bases below are made from them
    v_row = seq * sk_b + head * sk_h + kt * sk_t  # the keys' rows, and the values'
    q_seq = seq * sq_b + head * sq_h
    dko, dvo = tl.arange(0, DK), dc * BDV + tl.arange(0, BDV)
    dk_ok, dv_ok = dko < dk, dvo < dv
    k = tl.load(k_ptr + v_row[:, None] * dk + dko[None, :],
                mask=k_ok[:, None] & dk_ok[None, :], other=0.0)  # fmt: skip
    k = _base2(k, DOT)  # once here, where scaling each step's rows took a copy of them through registers
    v = tl.load(v_ptr + v_row[:, None] * dv + dvo[None, :], mask=k_ok[:, None] & dv_ok[None, :], other=0.0)
    v = v.to(DOT)
    dk_acc = tl.full([BN, DK], 0.0, tl.float32)
    dv_acc = tl.full([BN, BDV], 0.0, tl.float32)
    for h in range(0, blocks):
        it = b + shift - h
        use = (it >= 0) & (it < ITEMS)
        use = use & ((h > 0) | (blocks == 1) | (prev_grad != 0)) & ((h > 0) | (it > 0) | (prev_masked == 0))
        if use:
            j = h * L + kl
            # the row blocks some row of which sees a key of this tile: row p sees key j at distance FIRST + p - j
            # in 0..SPAN, so rows j_first - FIRST .. j_last + SPAN - FIRST
            j_first = h * L + t * BN
            p_lo = tl.maximum(j_first - FIRST, 0)
            p_hi = tl.minimum(j_first + tl.minimum(BN, L - t * BN) - 1 + SPAN - FIRST, Lq - 1)
            pp_hi = tl.where(p_hi >= p_lo, p_hi // BM + 1, 0)
            row0 = q_seq + it * sq_i
            a, c = pp_hi, pp_hi
            if WHOLE:
                # of those, the row blocks whose every row sees every key of the tile: rows j_last - FIRST .. j_first
                # + SPAN - FIRST; no mask there (rows past Lq add nothing: their lse is read as +inf)
                j_last = j_first + tl.minimum(BN, L - t * BN) - 1
                a = tl.minimum(tl.maximum((tl.maximum(j_last - FIRST, 0) + BM - 1) // BM, p_lo // BM), pp_hi)
                c = tl.minimum(tl.maximum(tl.maximum(j_first + SPAN - FIRST + 1, 0) // BM, a), pp_hi)
            # the row blocks of each head that see this tile: the masked ones, then the whole ones
            lo = p_lo // BM
            for g in range(0, G):
                for step in range(0, a - lo + pp_hi - c):
                    dk_acc, dv_acc = _window_key_rows(
                        dk_acc, dv_acc, _masked_step(step, lo, a, c, WHOLE), row0 + g * sq_g, sq_p, j, k, v, v_row,
                        k_ok, q_ptr, do_ptr, lse_ptr, delta_ptr, v_ptr, dl_ptr, Lq, FIRST, SPAN, M1, dk, dv, dc * BDV,
                        BM, BN, DK, BDV, ONE_CHUNK, DO_DK, DO_DV, HAS_BIAS, True, EVEN, DOT, PREC,
                    )  # fmt: skip
                if WHOLE:
                    for pp in range(a, c):
                        dk_acc, dv_acc = _window_key_rows(
                            dk_acc, dv_acc, pp, row0 + g * sq_g, sq_p, j, k, v,
                            v_row, k_ok, q_ptr, do_ptr, lse_ptr, delta_ptr, v_ptr, dl_ptr, Lq, FIRST, SPAN, M1, dk, dv,
                            dc * BDV, BM, BN, DK, BDV, ONE_CHUNK, DO_DK, DO_DV, HAS_BIAS, False, EVEN, DOT, PREC,
                        )  # fmt: skip
    tile_row0 = seq * sg_b + head * sg_h + (b * L + t * BN) * sg_t
    if DO_DK:
        _store_tile(dk_ptr, tile_row0, sg_t, L - t * BN, dk_acc, dko, dk_ok, dk, BN)
    if DO_DV:
        _store_tile(dv_ptr, tile_row0, sg_t, L - t * BN, dv_acc, dvo, dv_ok, dv, BN)


@triton.jit
def code_kernel(
    q_ptr, c_ptr, ln_ptr, mu_ptr, do_ptr, lse_ptr, delta_ptr, dc_ptr, dmu_ptr,
    ITEMS, G, Lq, S, dk, dv, code_seq_stride, code_item_stride,
    NPB, NDVG, HK: tl.constexpr, sq_b, sq_h, sq_i, sq_g, sq_p: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BDV: tl.constexpr, ONE_CHUNK: tl.constexpr,
    DO_DK: tl.constexpr, DO_DV: tl.constexpr, EVEN: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Grid ``(cdiv(S, BN)·NDVG, ITEMS, N)``: the gradient of ``BN`` codes of item ``i``'s cache: its means (chunk
    ``dc``) and, for a per-item codebook, its code vectors, from every row of the item."""
    z, i, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ct, dc = z // NDVG, z % NDVG
    c = ct * BN + tl.arange(0, BN)
    c_ok = c < S
    item = n * ITEMS + i
    mu_row = item * S + c
    dko, dvo = tl.arange(0, DK), dc * BDV + tl.arange(0, BDV)
    dk_ok, dv_ok = dko < dk, dvo < dv
    code = tl.load(c_ptr + n * code_seq_stride + i * code_item_stride + c[:, None] * dk + dko[None, :],
                   mask=c_ok[:, None] & dk_ok[None, :], other=0.0)  # fmt: skip
    code = _base2(code, DOT)  # the codes' scores in base 2, as the keys'
    mu = tl.load(mu_ptr + mu_row[:, None] * dv + dvo[None, :], mask=c_ok[:, None] & dv_ok[None, :], other=0.0)
    mu = mu.to(DOT)
    log_n = tl.load(ln_ptr + mu_row, mask=c_ok, other=float("-inf"))
    term_t = log_n[:, None] + tl.full([BN, BM], 0.0, tl.float32)  # base 2, as the scores
    dc_acc = tl.full([BN, DK], 0.0, tl.float32)
    dmu_acc = tl.full([BN, BDV], 0.0, tl.float32)
    row0 = _units(n, HK, sq_b, sq_h) + i * sq_i
    for pb in range(0, G * NPB):
        g, _, p, p_ok = _row_block(pb, NPB, Lq, BM)
        dc_acc, dmu_acc = _key_tile_grads(
            dc_acc, dmu_acc, code, mu, mu_row, c_ok, term_t, q_ptr, do_ptr, lse_ptr, delta_ptr, mu_ptr,
            row0 + g * sq_g + p * sq_p, p_ok, dk, dv, dc * BDV, BM, BN, DK, BDV, ONE_CHUNK,
            DO_DK, DO_DV, True, EVEN, DOT, PREC,
        )  # fmt: skip
    tile_row0 = item * S + ct * BN
    if DO_DK:
        _store_tile(dc_ptr, tile_row0, 1, S - ct * BN, dc_acc, dko, dk_ok, dk, BN)
    if DO_DV:
        _store_tile(dmu_ptr, tile_row0, 1, S - ct * BN, dmu_acc, dvo, dv_ok, dv, BN)
