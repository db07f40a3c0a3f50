"""The fused window + cache step of Transformer-VQ attention in Triton: forward and backward.

Over 300 lines: the two custom ops, their fake kernels and autograd registration share one launch layout
(:class:`_Layout`); apart, each would restate it.

Computes :func:`tvq_exp.attention.vq.kernel.window_cache_attention` (same inputs, same result; its plain
reference is :func:`tvq_exp.attention.vq.naive.window_cache_attention`), flash-attention style:

- **forward** (one program per ``BM`` rows of one head of one item, values ``BDV`` wide): an online softmax
  over the window's key tiles, then the cache's code tiles, in fp32; writes the output and the rows'
  log-sum-exp. Key tiles no row of the program can see (the causal mask, a sliding window, item 0's missing
  previous block) are skipped. Which keys a row sees and which bias column they read come from their distance
  (:class:`~tvq_exp.attention.vq.kernel.WindowIndex`), computed in the kernels: no table is read per tile.
  Where every tile is whole (no XL bias), the forward and ``dq`` load their key, value, code and mean tiles
  through tensor descriptors of the tensors' rows (:meth:`_Layout.descriptors`).
- **layouts**: the queries, keys and values are read through their strides in rows of their width (:func:`taken`;
  ``(B, T, H, d)`` memory seen as ``(B, H, T, d)``, a model's projections' layout, is not copied); the output,
  ``dq`` and the keys' and values' gradients are written dense in their inputs' dim order (so the gradients reach
  such leaves in their own layout, as flash's do).
- **backward** (recomputes the probabilities from the log-sum-exp; no atomics, so deterministic):
  ``dq`` and the distance logits' gradient per row block; the keys' and values' gradient per key tile of each
  key block, looping over the two items that see the block; the codes' means (and a per-item codebook)
  per code tile, looping over the item's rows.

The XL bias enters as the distance logits ``(q + v)·r_d`` of every row, ``(N, I, R, M + 1)`` in fp32, made by one
matmul before the kernel (torch takes their gradient to the bias queries and the embeddings): the window
term of key ``j`` of row ``r`` is that row's column at their distance (zero past the bias window, ``-inf`` where
masked). Each bias column is read by at most one key of a row (a column is a distance): so the logits'
gradient is written, not added, column by column.

Where it runs (:mod:`.support`): CUDA, or CPU under Triton's interpreter (``TRITON_INTERPRET=1``). Operands fp32,
bf16 or fp16 (the cache's means too). The forward and the backward are custom ops (``tvq::window_cache_forward``,
``tvq::window_cache_backward``, the second registered as the first's gradient): ``torch.compile`` keeps the fused
step in its graph as one opaque node (no graph break), and does not trace the launches."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.vq.fused.config import Tiles, padded_dim, tiles
from tvq_exp.attention.vq.fused.support import (
    block_units,
    dense_like,
    dense_units,
    extent,
    gradient_strides,
    kernels,
    unit_strides,
    unsupported,
)
from tvq_exp.attention.vq.kernel import WindowIndex, WindowInputs
from tvq_exp.nn.triton_loader import cdiv

MAX_ELEMENTS = 2**31  # the kernels index every tensor with int32 offsets
# the row term's (rows, columns a step) per program: compiled, or interpreted (small, to cross column steps in tests)
DELTA_TILES = {False: (64, 64), True: (16, 16)}
LOG2E = 1.4426950408889634  # the kernels' scores are in base 2


def fused_window_cache_attention(inputs: WindowInputs, prev_grad: bool = True) -> Tensor:
    """:func:`~tvq_exp.attention.vq.kernel.window_cache_attention` in Triton (shapes there): ``(N, I, R, d_v)``.
    With ``prev_masked`` and a two-block window, ``kb`` and ``vb`` may also leave out item 0's masked previous block
    (``(N, I, L, d)``): the kernels never read it, and the layer then joins no zero block in front (a copy of the
    window's keys and values).

    The queries may also come as ``(B, H_kv, I, G, Lq, d_k)`` and the keys and values as ``(B, H_kv, IB, L, d)`` (``N =
    B·H_kv``, ``R = G·Lq``): the layout a model's projections give several heads in (``(B, T, H, d)`` seen as ``(B, H,
    T, d)``), where ``B`` and ``H_kv`` do not merge into one ``N`` without a copy. The kernels read every row through
    its tensor's strides (:func:`~tvq_exp.attention.vq.fused.support.unit_strides`), so such inputs are not copied,
    and the output comes back in the queries' shape and layout (``(B, H_kv, I, G, Lq, d_v)``, dense in their order).

    Raises ValueError (one line) where it cannot run (:func:`unsupported`). The checks and the distance logits'
    matmul are plain torch; the kernels run in the custom op ``tvq::window_cache_forward`` (its gradient
    ``tvq::window_cache_backward``), which a compiled training step (``module.compile``) keeps in its graph."""
    q, kb, vb, index, bias, cache, prev_masked = inputs
    reason = unsupported(q.device, q.dtype)
    if reason:
        raise ValueError(f"window_cache_attention kernel=triton: {reason}")
    flat, heads = q.dim() == 4, q.shape[:2]
    if flat:  # one sequence axis: (N, I, R, d) is (N, 1, I, G, Lq, d)
        q, kb, vb = q.unflatten(2, (-1, index.rows)).unsqueeze(1), kb.unsqueeze(1), vb.unsqueeze(1)
    elif bias is not None:
        # with the XL bias the rows go contiguous, one sequence axis (a copy only of several heads' layout): the
        # distance logits' rows, flat from their matmul, are the queries', and the kernels' row arguments take the
        # values Triton specialises (one key head, positions one row apart): the bias's kernels compile without
        # spills so (make kernel-report)
        q, kb, vb = (x.contiguous().flatten(0, 1).unsqueeze(1) for x in (q, kb, vb))
    largest = max(extent(x) for x in (q, kb, vb))
    rows_out = q.numel() // q.shape[-1] * max(vb.shape[-1], 1 if bias is None else bias.rel.shape[-2])
    if max(largest, rows_out) >= MAX_ELEMENTS:
        raise ValueError(
            f"window_cache_attention kernel=triton: tensors of {max(largest, rows_out)} elements; the kernels' "
            f"offsets are int32 (< {MAX_ELEMENTS}): split the batch"
        )
    _check_blocks(q, kb, vb, index, prev_masked)
    if index.max_distance != (None if bias is None else bias.rel.shape[-2] - 1):
        raise ValueError(
            f"window_cache_attention kernel=triton: index {index} does not fit the bias's distances"
        )
    dl = None
    if bias is not None:
        bias_q, rel = bias
        n, items, rows, d_k = q.shape[0] * q.shape[1], q.shape[2], q.shape[3] * q.shape[4], q.shape[5]
        with torch.autocast(q.device.type, enabled=False):
            bq = bias_q.reshape(n, items, rel.shape[1], -1, d_k).float()
            dl = (bq @ rel[:, None].float().transpose(-1, -2)).reshape(n, items, rows, -1)  # (N, I, R, M + 1)
    codebook, log_n, mu = (None, None, None) if cache is None else cache
    if mu is not None and vb.dtype != torch.float32:  # as the products take them: half the bytes
        mu = mu.to(vb.dtype)
    out, _ = window_cache_forward(
        q, kb, vb, window_arguments(index), dl, codebook, log_n, mu, prev_masked, prev_grad
    )
    return out.flatten(0, 1).flatten(2, 3) if flat else out.view(*heads, *out.shape[2:])


def _check_blocks(q: Tensor, kb: Tensor, vb: Tensor, index: WindowIndex, prev_masked: bool) -> None:
    """Raise ValueError (one line) unless ``kb`` and ``vb`` hold the blocks the items' windows read: ``I + blocks -
    1``, or ``I`` where item 0's masked previous block is left out."""
    items, blocks, ib = q.shape[2], index.width // kb.shape[3], kb.shape[2]
    allowed = [items + blocks - 1] + ([items] if prev_masked and blocks == 2 else [])
    if ib not in allowed or vb.shape[2] != ib:
        raise ValueError(
            f"window_cache_attention kernel=triton: {ib} key and {vb.shape[2]} value blocks for {items} items of a "
            f"{blocks}-block window; allowed: {' or '.join(map(str, allowed))}"
            + ("" if prev_masked else " (without prev_masked, item 0's previous block must be given)")
        )


def window_arguments(index: WindowIndex) -> list[int]:
    """The custom ops' ``window``: ``[first, rows, width, span]`` of ``index``, ``span`` past every distance when
    there is no sliding window (the bias columns come from the distance logits' width)."""
    span = index.first + index.rows if index.span is None else index.span
    return [index.first, index.rows, index.width, span]


class _Layout:
    """The sizes, tiles and flat arguments of one call (shared by the forward and the backward): queries ``q (B, H_kv,
    I, G, Lq, d_k)`` (:func:`taken_queries`), keys ``kb (B, H_kv, IB, L, d_k)`` and values ``vb`` (:func:`taken`), their
    rows by unit strides; the outputs, ``dq``, ``dO`` and the rows' ``lse`` and row term in the queries' layout, the
    keys' and values' gradients dense in the keys' order (:attr:`g_units`)."""

    def __init__(self, q: Tensor, kb: Tensor, vb: Tensor, window: list[int], dl: Tensor | None,
                 codebook: Tensor | None, prev_masked: bool) -> None:  # fmt: skip
        self.interpret = q.device.type == "cpu"
        b, self.hk, self.items, g, lq, self.d_k = q.shape
        self.n, self.rows = b * self.hk, g * lq
        self.ib, self.block, self.d_v = kb.shape[2], kb.shape[3], vb.shape[-1]
        self.q_units = unit_strides(q.shape, q.stride())
        self.k_units = block_units(kb.shape, kb.stride())  # also the values' (:func:`taken`)
        self.g_units = block_units(kb.shape, gradient_strides(kb.shape, kb.stride(), kb.shape[-1]))
        self.first, self.lq, self.width, self.span = window
        self.blocks = self.width // self.block  # window blocks: 2, or 1 for a lone first block
        self.shift = self.items + self.blocks - 1 - self.ib  # 1: kb leaves out item 0's masked previous block
        self.g = self.rows // self.lq
        self.m1 = 0 if dl is None else dl.shape[-1]
        self.s = 0 if codebook is None else codebook.shape[-2]
        self.per_item = codebook is not None and codebook.dim() == 4
        self.code_strides = (0, 0) if codebook is None else (
            (self.items * self.s * self.d_k, self.s * self.d_k) if self.per_item else (self.s * self.d_k, 0)
        )  # fmt: skip
        self.prev_masked = int(prev_masked)
        lowp = q.dtype if q.dtype in (torch.bfloat16, torch.float16) and not self.interpret else None
        tl = kernels(self.interpret).tl
        self.dot = {None: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[lowp]
        # fp32 dots: exact under the interpreter, three tf32 products on the GPU (fp32's accuracy on the
        # tensor cores; ieee fp32 dots take none); ignored for bf16/fp16
        self.fp32 = q.dtype == torch.float32
        self.prec = "ieee" if self.interpret else "tf32x3" if lowp is None else "tf32"
        self.dk_pad = padded_dim(self.d_k)

    def tiles(self, kernel: str) -> Tiles:
        strided = self.k_units[-1] > 1  # the keys' rows apart: several key heads innermost
        return tiles(
            kernel, self.d_k, self.d_v, self.interpret, self.fp32, self.m1 > 0, self.block, self.s, strided
        )

    def whole(self, t: Tiles) -> bool:
        """The kernels' ``WHOLE``: the tiles every row of a row block sees (every key of a key tile, in the keys'
        gradient) run without a mask, where there is no XL bias and ``t``'s key tiles are whole (``L`` a multiple of
        ``BN``). With the bias every tile takes its mask, in one loop: a loop of their own for the whole tiles spilled
        registers at ``d_k = 128`` when it was tried (``make kernel-report``)."""
        return self.m1 == 0 and self.block % t.bn == 0

    def even(self, t: Tiles, rows: bool = False) -> bool:
        """The kernels' ``EVEN``: the tiles their loops load are whole, so they load them without masks: the key and
        code tiles (the forward, ``dq``) or, ``rows``, the row blocks (the keys' and codes' gradients); and the
        value chunks whole, ``d_k`` unpadded (the GPU path's heads)."""
        whole = self.lq % t.bm == 0 if rows else self.block % t.bn == 0 and self.s % t.bn == 0
        return whole and self.d_v % t.bdv == 0 and self.d_k == self.dk_pad

    def descriptors(self, t: Tiles, kb: Tensor, vb: Tensor, codebook: Tensor | None,
                    mu: Tensor | None) -> list[object] | None:  # fmt: skip
        """The tensor descriptors of the key, value, code and mean tiles (the kernels' ``k_desc, v_desc, c_desc,
        mu_desc``; None for an absent cache) where the forward or ``dq`` loads its tiles through them: ``t.tma``,
        every tile whole (:meth:`whole`, :meth:`even`: a descriptor's copy has no mask), and every tensor in the keys'
        dtype with a 16-byte aligned start (a descriptor's base) and rows (its row stride); else None (their
        pointers). A key tensor's descriptor rows are ``s_t`` of its rows wide (``s_t``: its keys' unit stride), so
        that consecutive keys of one head are consecutive descriptor rows: the key at unit offset ``u`` is row ``u //
        s_t``, columns from ``(u % s_t)·d`` (the kernels' ``_keys``); the codes' and means' are their flat rows."""
        if not (t.tma and self.whole(t) and self.even(t)):
            return None
        present = [(kb, self.k_units[-1]), (vb, self.k_units[-1])]
        present += [(x, 1) for x in (codebook, mu) if x is not None]
        if any(x.dtype != kb.dtype or x.data_ptr() % 16 or (x.shape[-1] * step * x.element_size()) % 16
               for x, step in present):  # fmt: skip
            return None
        from triton.tools.tensor_descriptor import TensorDescriptor

        def rows(x: Tensor | None, step: int, cols: int) -> object:
            if x is None:
                return None
            width = x.shape[-1] * step
            return TensorDescriptor(x, [(extent(x) - 1) // width + 1, width], [width, 1], [t.bn, cols])

        return [
            rows(kb, self.k_units[-1], self.dk_pad), rows(vb, self.k_units[-1], t.bdv),
            rows(codebook, 1, self.dk_pad), rows(mu, 1, t.bdv),
        ]  # fmt: skip

    def tile_counts(self, t: Tiles) -> tuple[int, int, int]:
        """``NPB`` row blocks per head, ``NWT`` window tiles, ``TPB`` tiles per key block."""
        tpb = cdiv(self.block, t.bn)
        return cdiv(self.lq, t.bm), self.blocks * tpb, tpb

    @property
    def geometry(self) -> tuple[int, ...]:
        """The window's arguments of every kernel that reads the window: ``Lq, L, W, FIRST, SPAN``."""
        return self.lq, self.block, self.width, self.first, self.span

    @property
    def row_strides(self) -> tuple[int, ...]:
        """The kernels' row arguments: ``HK`` and the queries' unit strides ``sq_b, sq_h, sq_i, sq_g, sq_p`` (also the
        outputs', ``dO``'s, ``dq``'s, ``lse``'s, the row term's and the distance logits')."""
        return self.hk, *self.q_units

    @property
    def key_strides(self) -> tuple[int, ...]:
        """The keys' (and values') unit strides ``sk_b, sk_h, sk_t``."""
        return self.k_units


def taken_queries(q: Tensor, bias: bool) -> Tensor:
    """The queries ``(B, H_kv, I, G, Lq, d_k)`` as the kernels read them: themselves where they are dense with unit
    strides (:func:`~tvq_exp.attention.vq.fused.support.unit_strides`; their rows are then the output's, ``lse``'s and
    the backward's, which are allocated dense in their order) and, with the XL bias, contiguous (the distance logits'
    rows, flat from their matmul, are then theirs); else a contiguous copy."""
    units = unit_strides(q.shape, q.stride())
    keep = units is not None and units == dense_units(q) and (not bias or q.is_contiguous())
    return q if keep else q.contiguous()


def taken(kb: Tensor, vb: Tensor) -> tuple[Tensor, Tensor]:
    """Keys and values ``(B, H_kv, IB, L, ·)`` as the kernels read them: the keys themselves where their blocks are cut
    from one time axis with unit strides (:func:`~tvq_exp.attention.vq.fused.support.block_units`), else a contiguous
    copy; the values themselves where they have the keys' unit strides (the kernels read both through the keys' rows:
    one base a sequence, fewer registers), else a copy in the keys' layout."""
    kb = kb if block_units(kb.shape, kb.stride()) is not None else kb.contiguous()
    units = unit_strides(kb.shape, kb.stride())
    if unit_strides(vb.shape, vb.stride()) != units:
        width = vb.shape[-1]
        vb = vb.new_empty_strided(vb.shape, (*(u * width for u in units), 1)).copy_(vb)
    return kb, vb


def _contiguous(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()


@torch.library.custom_op("tvq::window_cache_forward", mutates_args=(), device_types=("cpu", "cuda"))
def window_cache_forward(
    q: Tensor, kb: Tensor, vb: Tensor, window: list[int], dl: Tensor | None, codebook: Tensor | None,
    log_n: Tensor | None, mu: Tensor | None, prev_masked: bool, prev_grad: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The forward kernel: ``q (B, H_kv, I, G, Lq, d_k)``, ``kb, vb (B, H_kv, IB, L, ·)`` (any strides: :func:`taken`)
    -> the output ``(B, H_kv, I, G, Lq, d_v)`` (``vb``'s dtype) and the rows' log-sum-exp ``(B, H_kv, I, G, Lq)`` (fp32,
    no gradient; the backward's), both dense in the queries' order. ``window`` is :func:`window_arguments`; ``dl`` the
    distance logits ``(N, I, R, M + 1)``, or None; ``prev_grad`` is the backward's."""
    q, kb, vb = taken_queries(q, dl is not None), *taken(kb, vb)
    dl, codebook, mu = map(_contiguous, (dl, codebook, mu))
    log_n = _log2_counts(log_n)
    lay = _Layout(q, kb, vb, window, dl, codebook, prev_masked)
    out, lse = _outputs(q, vb)
    t = lay.tiles("forward")
    npb, _, tpb = lay.tile_counts(t)
    ndv = cdiv(lay.d_v, t.bdv)
    dummy, fp32 = q, lse  # stand-ins for absent inputs: the distance logits and log counts are fp32
    descriptors = lay.descriptors(t, kb, vb, codebook, mu)
    kernels(lay.interpret).forward_kernel[(lay.g * npb, lay.items, lay.n * ndv)](
        q, kb, vb, _or(dl, fp32), _or(codebook, dummy), _or(log_n, fp32), _or(mu, dummy), out, lse,
        *(descriptors or [None] * 4), lay.items, *lay.geometry, lay.s, lay.m1, lay.d_k, lay.d_v,
        *lay.code_strides, lay.prev_masked, lay.shift, npb, tpb, *lay.row_strides, *lay.key_strides,
        BM=t.bm, BN=t.bn, DK=lay.dk_pad, BDV=t.bdv, HAS_CACHE=codebook is not None, HAS_BIAS=dl is not None,
        WHOLE=lay.whole(t), EVEN=lay.even(t), TMA=descriptors is not None, DOT=lay.dot, PREC=lay.prec,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out, lse


def _outputs(q: Tensor, vb: Tensor) -> tuple[Tensor, Tensor]:
    """The forward's output and ``lse``, empty, in the (taken) queries' layout."""
    lse = q.new_empty_strided(q.shape[:-1], dense_units(q), dtype=torch.float32)
    return dense_like(q, vb.shape[-1], vb.dtype), lse


@window_cache_forward.register_fake
def _forward_fake(
    q: Tensor, kb: Tensor, vb: Tensor, window: list[int], dl: Tensor | None, codebook: Tensor | None,
    log_n: Tensor | None, mu: Tensor | None, prev_masked: bool, prev_grad: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    return _outputs(
        taken_queries(q, dl is not None), vb
    )  # the real op's strides: torch.compile relies on them


@torch.library.custom_op("tvq::window_cache_backward", mutates_args=(), device_types=("cpu", "cuda"))
def window_cache_backward(
    grad_out: Tensor, q: Tensor, kb: Tensor, vb: Tensor, window: list[int], dl: Tensor | None,
    codebook: Tensor | None, log_n: Tensor | None, mu: Tensor | None, out: Tensor, lse: Tensor,
    prev_masked: bool, prev_grad: bool, need: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The backward kernels: the gradients of ``q, kb, vb, dl``, a per-item ``codebook`` and ``mu`` where ``need``
    (six flags, in that order) asks for them, else empty tensors (``(0,)``; a shared codebook takes none). ``dq`` comes
    dense in the queries' order (as the output), the keys' and values' gradients dense in the keys' order."""
    q, kb, vb = taken_queries(q, dl is not None), *taken(kb, vb)
    dl, codebook, mu = map(_contiguous, (dl, codebook, mu))
    log_n = _log2_counts(log_n)
    want_q, want_k, want_v, want_dl, want_code, want_mu = need
    lay = _Layout(q, kb, vb, window, dl, codebook, prev_masked)
    # dO as the kernels read it: in the output's layout (a gradient flowing back through views of it already is)
    same = unit_strides(grad_out.shape, grad_out.stride()) == lay.q_units
    do = grad_out if same else dense_like(q, out.shape[-1], out.dtype).copy_(grad_out)
    delta = _row_term(lay, do, out)
    dummy = q
    common = (_or(dl, lse), _or(codebook, dummy), _or(log_n, lse), _or(mu, dummy))
    dq = ddl = None
    if want_q or want_dl:
        dq = dense_like(q, lay.d_k, q.dtype)  # written whenever the kernel runs
        ddl = torch.zeros_like(dl) if want_dl else None
        t = lay.tiles("dq")
        npb, _, tpb = lay.tile_counts(t)
        descriptors = lay.descriptors(t, kb, vb, codebook, mu)
        kernels(lay.interpret).dq_kernel[(lay.g * npb, lay.items, lay.n)](
            q, kb, vb, *common, do, lse, delta, dq, _or(ddl, lse), *(descriptors or [None] * 4),
            lay.items, *lay.geometry, lay.s, lay.m1, lay.d_k, lay.d_v,
            *lay.code_strides, lay.prev_masked, lay.shift, npb, tpb, *lay.row_strides, *lay.key_strides,
            BM=t.bm, BN=t.bn, DK=lay.dk_pad, BDV=t.bdv, HAS_CACHE=codebook is not None, HAS_BIAS=dl is not None,
            BIAS_GRAD=ddl is not None, ONE_CHUNK=t.bdv >= lay.d_v, WHOLE=lay.whole(t), EVEN=lay.even(t),
            TMA=descriptors is not None, DOT=lay.dot, PREC=lay.prec, num_warps=t.num_warps,
            num_stages=t.num_stages,
        )  # fmt: skip
    dkb, dvb = _key_grads(kb, vb, want_k, want_v)
    if dkb is not None or dvb is not None:
        _window_key_grads(lay, q, kb, vb, dl, do, lse, delta, dkb, dvb, prev_grad)
    dcode = torch.empty_like(codebook) if want_code and lay.per_item else None
    dmu = torch.empty_like(mu) if want_mu else None
    if dcode is not None or dmu is not None:
        _code_grads(lay, q, codebook, log_n, mu, do, lse, delta, dcode, dmu)
    grads = (dq if want_q else None, dkb, dvb, ddl, dcode, dmu)
    return tuple(q.new_empty(0) if x is None else x for x in grads)


@window_cache_backward.register_fake
def _backward_fake(
    grad_out: Tensor, q: Tensor, kb: Tensor, vb: Tensor, window: list[int], dl: Tensor | None,
    codebook: Tensor | None, log_n: Tensor | None, mu: Tensor | None, out: Tensor, lse: Tensor,
    prev_masked: bool, prev_grad: bool, need: list[bool],
) -> tuple[Tensor, ...]:  # fmt: skip
    want_q, want_k, want_v, want_dl, want_code, want_mu = need
    want_code = want_code and codebook is not None and codebook.dim() == 4
    # in the layouts the kernels write them in (torch.compile relies on the strides)
    q, kb, vb = taken_queries(q, dl is not None), *taken(kb, vb)
    dkb, dvb = _key_grads(kb, vb, want_k, want_v)
    grads = (
        dense_like(q, q.shape[-1], q.dtype) if want_q else None, dkb, dvb,
        dl.new_empty(dl.shape) if want_dl else None,
        codebook.new_empty(codebook.shape) if want_code else None, mu.new_empty(mu.shape) if want_mu else None,
    )  # fmt: skip
    return tuple(q.new_empty(0) if x is None else x for x in grads)


def _key_grads(kb: Tensor, vb: Tensor, want_k: bool, want_v: bool) -> tuple[Tensor | None, Tensor | None]:
    """The keys' and values' gradients, empty (None where not wanted): dense in the (taken) keys' order
    (:func:`~tvq_exp.attention.vq.fused.support.gradient_strides`; the kernels write both through one set of rows)."""

    def grad(x: Tensor, want: bool) -> Tensor | None:
        return (
            x.new_empty_strided(x.shape, gradient_strides(kb.shape, kb.stride(), x.shape[-1]))
            if want
            else None
        )

    return grad(kb, want_k), grad(vb, want_v)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:  # noqa: ANN001
    q, kb, vb, window, dl, codebook, log_n, mu, prev_masked, prev_grad = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, kb, vb, dl, codebook, log_n, mu, out, lse)
    ctx.window, ctx.prev_masked, ctx.prev_grad = window, prev_masked, prev_grad


def _backward(ctx, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:  # noqa: ANN001
    """The gradients of :func:`window_cache_forward`'s inputs (None where none is asked for, and for
    ``window``, ``log_n`` and a shared codebook)."""
    q, kb, vb, dl, codebook, log_n, mu, out, lse = ctx.saved_tensors
    need = ctx.needs_input_grad  # q, kb, vb, window, dl, codebook, log_n, mu, prev_masked, prev_grad
    per_item = codebook is not None and codebook.dim() == 4
    flags = [*need[:3], need[4] and dl is not None, need[5] and per_item, need[7] and mu is not None]
    grads = window_cache_backward(
        grad_out, q, kb, vb, ctx.window, dl, codebook, log_n, mu, out, lse, ctx.prev_masked, ctx.prev_grad, flags
    )  # fmt: skip
    dq, dkb, dvb, ddl, dcode, dmu = (g if want else None for g, want in zip(grads, flags, strict=True))
    return dq, dkb, dvb, None, ddl, dcode, None, dmu, None, None


window_cache_forward.register_autograd(_backward, setup_context=_setup_context)


def _row_term(lay: _Layout, do: Tensor, out: Tensor) -> Tensor:
    """``Σ dO·O`` per row, fp32, in ``lse``'s layout, the backward kernels' softmax term: one kernel reading both once
    (``(do.float() * out.float()).sum(-1)`` made two fp32 copies and a product: 1.75 GiB of traffic at the GPU
    check's 32k, against 0.25). ``out`` is dense and ``do`` in its layout, so the kernel takes their rows in memory
    order."""
    delta = out.new_empty_strided(out.shape[:-1], dense_units(out), dtype=torch.float32)
    rows, columns = DELTA_TILES[lay.interpret]
    kernels(lay.interpret).delta_kernel[(cdiv(delta.numel(), rows),)](
        do, out, delta, delta.numel(), lay.d_v, BM=rows, BD=columns, num_warps=4
    )
    return delta


def _log2_counts(log_n: Tensor | None) -> Tensor | None:
    """The kernels' log counts: in base 2, as their scores (fp32; a product less per score in their loops)."""
    return None if log_n is None else (log_n.float() * LOG2E).contiguous()


def _or(x: Tensor | None, dummy: Tensor) -> Tensor:
    """``x``, or a placeholder pointer for an absent input (the kernel never reads it)."""
    return dummy if x is None else x


def _passes(lay: _Layout, t: Tiles, want_k: bool, want_v: bool) -> list[tuple[bool, bool, int]]:
    """The launches of a key-gradient kernel: ``(DO_DK, DO_DV, value chunks)``; one when ``d_v`` fits one
    chunk, else the values' chunks and the keys apart (the keys' gradient needs all of ``d_v``)."""
    ndv = cdiv(lay.d_v, t.bdv)
    if ndv == 1:
        return [(want_k, want_v, 1)]
    return [p for p in [(False, True, ndv), (True, False, 1)] if (p[0] and want_k) or (p[1] and want_v)]


def _window_key_grads(lay: _Layout, q: Tensor, kb: Tensor, vb: Tensor, dl: Tensor | None, do: Tensor,
                      lse: Tensor, delta: Tensor, dkb: Tensor | None, dvb: Tensor | None,
                      prev_grad: bool) -> None:  # fmt: skip
    t = lay.tiles("window_key")
    tpb = lay.tile_counts(t)[2]
    for do_k, do_v, chunks in _passes(lay, t, dkb is not None, dvb is not None):
        kernels(lay.interpret).window_key_kernel[(tpb * chunks, lay.ib, lay.n)](
            q, kb, vb, _or(dl, q), do, lse, delta, _or(dkb, q), _or(dvb, q),
            lay.items, lay.g, lay.lq, lay.block, lay.first, lay.span, lay.m1, lay.d_k, lay.d_v,
            lay.prev_masked, lay.shift, int(prev_grad), lay.blocks, tpb, chunks, *lay.row_strides, *lay.key_strides,
            *lay.g_units,
            BM=t.bm, BN=t.bn, DK=lay.dk_pad, BDV=t.bdv, ONE_CHUNK=t.bdv >= lay.d_v, DO_DK=do_k, DO_DV=do_v,
            HAS_BIAS=dl is not None, WHOLE=lay.whole(t), EVEN=lay.even(t, rows=True), DOT=lay.dot, PREC=lay.prec,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip


def _code_grads(lay: _Layout, q: Tensor, codebook: Tensor, log_n: Tensor, mu: Tensor, do: Tensor,
                lse: Tensor, delta: Tensor, dcode: Tensor | None, dmu: Tensor | None) -> None:  # fmt: skip
    t = lay.tiles("code")
    npb = cdiv(lay.lq, t.bm)
    for do_k, do_v, chunks in _passes(lay, t, dcode is not None, dmu is not None):
        kernels(lay.interpret).code_kernel[(cdiv(lay.s, t.bn) * chunks, lay.items, lay.n)](
            q, codebook, log_n, mu, do, lse, delta, _or(dcode, q), _or(dmu, q),
            lay.items, lay.g, lay.lq, lay.s, lay.d_k, lay.d_v, *lay.code_strides, npb, chunks, *lay.row_strides,
            BM=t.bm, BN=t.bn, DK=lay.dk_pad, BDV=t.bdv, ONE_CHUNK=t.bdv >= lay.d_v, DO_DK=do_k, DO_DV=do_v,
            EVEN=lay.even(t, rows=True), DOT=lay.dot, PREC=lay.prec, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip


__all__ = [
    "MAX_ELEMENTS",
    "fused_window_cache_attention",
    "window_arguments",
    "window_cache_backward",
    "window_cache_forward",
]
