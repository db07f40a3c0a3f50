"""Transformer-VQ attention: exact w.r.t. dense softmax over quantised keys, streaming, causal."""

from __future__ import annotations

import pytest
import torch

import tvq_exp.attention.vq.kernel as vq_kernel
from tests.attention.backends import build
from tests.helpers.ops import OpLog
from tvq_exp.attention.dense.naive import softmax_attention
from tvq_exp.attention.vq import VQAttention
from tvq_exp.attention.vq.kernel import (
    CodeCache,
    WindowBias,
    WindowIndex,
    WindowInputs,
    window_cache_attention,
)
from tvq_exp.attention.vq.naive import vq_attention as vq_reference
from tvq_exp.attention.vq.naive import window_cache_attention as window_cache_reference


def make_vq(
    block_len: int, window_bias: bool = False, window_len: int | None = None, dtype=torch.float64, **kw
) -> VQAttention:
    attn = build(
        "vq",
        d_k=6,
        d_v=5,
        heads=2,
        codebook_size=7,
        block_len=block_len,
        window_bias=window_bias,
        window_len=window_len,
        **kw,
    ).to(dtype)
    if window_bias:
        torch.nn.init.normal_(attn.bias.u)
        torch.nn.init.normal_(attn.bias.v)
    return attn.eval()


def qkv(t: int, dtype=torch.float64, b: int = 2, h: int = 2, grad: bool = True):
    mk = lambda d: torch.randn(b, h, t, d, dtype=dtype, requires_grad=grad)
    return mk(6), mk(6), mk(5)


@pytest.mark.parametrize("window_bias", [False, True])
@pytest.mark.parametrize("block_len,t", [(4, 16), (8, 16), (16, 16), (4, 13), (5, 23), (1, 6)])
def test_vq_equals_dense_softmax_over_quantised_keys_fp64(window_bias: bool, block_len: int, t: int) -> None:
    attn = make_vq(block_len, window_bias, window_len=min(3, block_len) if window_bias else None)
    q, k, v = qkv(t)
    out, _, _ = attn(q, k, v)
    ref = vq_reference(attn, q, k, v)
    assert torch.allclose(out, ref, atol=1e-10, rtol=0)
    g = torch.randn_like(out)
    gq, gk, gv = torch.autograd.grad((out * g).sum(), (q, k, v))
    rq, _, rv = torch.autograd.grad((ref * g).sum(), (q, k, v))
    assert torch.allclose(gq, rq, atol=1e-10, rtol=0)
    assert torch.allclose(gv, rv, atol=1e-10, rtol=0)
    assert gk.abs().sum() > 0  # straight-through keys receive gradient from the window


def test_vq_fp32_matches_reference_relative() -> None:
    attn = make_vq(8, window_bias=True, window_len=8, dtype=torch.float32)
    q, k, v = qkv(50, dtype=torch.float32, grad=False)
    out, _, _ = attn(q, k, v)
    ref = vq_reference(attn.double(), q.double(), k.double(), v.double())
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_vq_block_length_invariance_with_fixed_bias_window() -> None:
    q, k, v = qkv(24, grad=False)
    outs = []
    for block_len in (3, 4, 6, 8, 12, 24):
        attn = make_vq(block_len, window_bias=True, window_len=3)
        torch.manual_seed(1)
        ref_attn = make_vq(3, window_bias=True, window_len=3)
        attn.load_state_dict(ref_attn.state_dict())
        outs.append(attn(q, k, v)[0])
    for o in outs[1:]:
        assert torch.allclose(o, outs[0], atol=1e-12)


@pytest.mark.parametrize("splits", [[5], [8], [1, 2, 3], [7, 7]])
def test_vq_segment_continuation_equals_one_shot(splits: list[int]) -> None:
    attn = make_vq(4, window_bias=True, window_len=4)
    q, k, v = qkv(21, grad=False)
    full, _, _ = attn(q, k, v)
    pieces, state, start = [], None, 0
    for end in [*torch.tensor(splits).cumsum(0).tolist(), 21]:
        o, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        pieces.append(o)
        start = end
    assert torch.allclose(torch.cat(pieces, 2), full, atol=1e-12)
    assert state.position == 21


def test_vq_token_by_token_decoding_equals_parallel_and_state_is_bounded() -> None:
    attn = make_vq(4, window_bias=True, window_len=2)
    q, k, v = qkv(19, grad=False)
    full, _, _ = attn(q, k, v)
    state, outs = None, []
    for t in range(19):
        o, state, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        outs.append(o)
        assert state.k.shape[2] < 2 * 4  # O(L + S) state, never the whole history
    assert torch.allclose(torch.cat(outs, 2), full, atol=1e-12)
    assert state.cache_n.sum(-1).eq(12).all()  # blocks 0..2 (12 tokens) are in the cache


def test_vq_carried_state_is_detached() -> None:
    attn = make_vq(4)
    q, k, v = qkv(10)
    _, state, _ = attn(q, k, v)
    assert not any(x.requires_grad for x in state.tensors())


@pytest.mark.parametrize("align", [8, 16])
def test_the_xl_table_padded_as_on_cuda_gives_the_reference(
    monkeypatch: pytest.MonkeyPatch, align: int
) -> None:
    """On CUDA the plain kernel's XL distance table has zero columns to a multiple of 8 (the products' rows aligned
    for cuBLAS): with this CPU's table padded the same way, the outputs and every gradient (queries, keys, values, the
    bias's parameters) are the reference's, keys beyond the bias window and a lone first block included."""
    monkeypatch.setitem(vq_kernel.XL_TABLE_ALIGN, "cpu", align)
    attn = make_vq(4, window_bias=True, window_len=3)
    q, k, v = qkv(13)
    out, ref = attn(q, k, v)[0], vq_reference(attn, q, k, v)
    assert torch.allclose(out, ref, atol=1e-10, rtol=0)
    g = torch.randn_like(out)
    leaves = (q, k, v, *attn.bias.parameters())
    grads = torch.autograd.grad((out * g).sum(), leaves), torch.autograd.grad((ref * g).sum(), leaves)
    for got, want in zip(*grads, strict=True):
        assert torch.allclose(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("cache_keys", ["code", "mean"])
@pytest.mark.parametrize("batch,kv_heads", [(2, 2), (1, 1)])
def test_vq_carried_state_is_its_own_compact_copy_at_every_position(
    cache_keys: str, batch: int, kv_heads: int
) -> None:
    """Segments of a sequence whose keys and values come as projections give them (``(B, T, H, d)`` transposed): each
    carried state's tensors are contiguous copies of the window alone (not views holding the segment's keys), so
    their strides are the same at every position (a compiled block guards on them); also where one sequence and one
    key head leave only size-1 dims before the cut (``contiguous()`` returns such a view as it is)."""
    attn = make_vq(4, cache_keys=cache_keys, kv_heads=kv_heads)
    q = torch.randn(batch, 32, 2, 6, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(batch, 32, kv_heads, d, dtype=torch.float64).transpose(1, 2) for d in (6, 5))
    state, strides = None, set()
    for t in range(0, 32, 8):  # whole blocks a segment: the state's shapes are the same at every position
        _, state, _ = attn(q[:, :, t : t + 8], k[:, :, t : t + 8], v[:, :, t : t + 8], state)
        tensors = {name: x for name, x in vars(state).items() if isinstance(x, torch.Tensor)}
        assert {"k", "v", "codes", "cache_n", "cache_mu"} <= tensors.keys()
        for name, x in tensors.items():
            assert x.is_contiguous(), name
            assert x.stride() == torch.empty(x.shape).stride(), f"{name}'s strides are not its own"
            assert x.untyped_storage().nbytes() == x.numel() * x.element_size(), f"{name} is a view of more"
        strides.add(tuple((name, x.stride()) for name, x in sorted(tensors.items())))
    assert len(strides) == 1


@pytest.mark.parametrize("window_bias", [False, True])
def test_vq_causal_by_jacobian(window_bias: bool) -> None:
    attn = make_vq(3, window_bias, window_len=3 if window_bias else None)
    t = 10
    q, k, v = qkv(t, b=1, h=2, grad=False)

    def f(x: torch.Tensor) -> torch.Tensor:
        return attn(x[..., :6], x[..., 6:12], x[..., 12:], None)[0]

    jac = torch.autograd.functional.jacobian(f, torch.cat([q, k, v], -1))  # (1,2,T,5, 1,2,T,17)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(per_pos.triu(1) == 0)
    assert torch.all(per_pos.diagonal() > 0)
    assert per_pos[:, :3].sum() > 0 and per_pos[-1, :3].sum() > 0  # the cache passes value gradients


@pytest.mark.parametrize("window_len", [4, 2, 0])
def test_vq_without_cache_is_the_official_sliding_window(window_len: int) -> None:
    """``use_cache=False`` is the official ``agg_cache=0``: each query sees the keys at distances ``0..M``
    (hand-built mask), whatever the block length."""
    attn = make_vq(4, use_cache=False, window_len=window_len)
    q, k, v = qkv(16, grad=False)
    out, _, _ = attn(q, k, v)
    k_hat, _, _ = attn.quantizer(k)
    pos = torch.arange(16)
    window = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] <= window_len)
    logits = (q @ k_hat.transpose(-1, -2)).masked_fill(~window, float("-inf"))
    assert torch.allclose(out, torch.softmax(logits, -1) @ v, atol=1e-12)


def test_grad_through_cache_off_stops_the_gradient_at_the_queries_own_block() -> None:
    """The official ``grad_thru_cache=0`` stop-gradients the whole carried state: a query's gradient reaches
    the keys and values of its own block only, not the previous block in its window nor the cache; the
    forward is unchanged."""
    on, off = make_vq(4, window_bias=True), make_vq(4, window_bias=True, grad_through_cache=False)
    off.load_state_dict(on.state_dict())
    q, k, v = qkv(16)
    out_on, _, _ = on(q, k, v)
    out_off, _, _ = off(q, k, v)
    assert torch.allclose(out_on, out_off, atol=1e-12)
    query = 9  # block 2: its own block is 8..11, the previous 4..7, the cache 0..3
    dk, dv = torch.autograd.grad(out_off[:, :, query].sum(), (k, v))
    assert dk[:, :, 8:10].abs().sum() > 0 and dv[:, :, 8:10].abs().sum() > 0
    assert dk[:, :, :8].abs().sum() == 0 and dv[:, :, :8].abs().sum() == 0
    dk_on, dv_on = torch.autograd.grad(out_on[:, :, query].sum(), (k, v))
    assert dk_on[:, :, 4:8].abs().sum() > 0 and dv_on[:, :, 0:8].abs().sum() > 0


def test_grad_through_cache_off_keeps_forward_and_drops_cache_value_gradient() -> None:
    on, off = make_vq(3), make_vq(3, grad_through_cache=False)
    off.load_state_dict(on.state_dict())
    q, k, v = qkv(12)
    out_on, out_off = on(q, k, v)[0], off(q, k, v)[0]
    assert torch.allclose(out_on, out_off, atol=1e-12)
    g_on = torch.autograd.grad(out_on[:, :, -1].sum(), v)[0]
    g_off = torch.autograd.grad(out_off[:, :, -1].sum(), v)[0]
    assert (
        g_on[:, :, :6].abs().sum() > 0 and g_off[:, :, :6].abs().sum() == 0
    )  # blocks 0, 1 are cached for block 3


def test_public_api_codebook_and_aux() -> None:
    attn = build("vq", d_k=8, d_v=16, heads=2, codebook_size=32, block_len=4, window_bias=False)
    assert attn.codebook.shape == (2, 32, 8)
    k = torch.randn(3, 2, 10, 8, requires_grad=True)
    out, state, aux = attn(torch.randn(3, 2, 10, 8), k, torch.randn(3, 2, 10, 16))
    assert out.shape == (3, 2, 10, 16)
    assert {"commit_loss", "perplexity", "quant_error", "dead_codes"} <= set(aux)
    assert aux["commit_loss"].requires_grad and 1.0 <= float(aux["perplexity"]) <= 32.0


def test_grouped_key_value_heads_equal_repeated_reference() -> None:
    attn = build(
        "vq", d_k=6, d_v=5, heads=4, kv_heads=2, codebook_size=7, block_len=4, window_bias=False
    ).double()
    q = torch.randn(2, 4, 13, 6, dtype=torch.float64)
    k, v = torch.randn(2, 2, 13, 6, dtype=torch.float64), torch.randn(2, 2, 13, 5, dtype=torch.float64)
    out, _, _ = attn(q, k, v)
    k_hat, _, _ = attn.quantizer(k)
    assert torch.allclose(out, softmax_attention(q, k_hat, v), atol=1e-10)


def test_cache_statistics_stay_fp32_and_exact_under_bf16_autocast() -> None:
    attn = build("vq", d_k=8, d_v=8, heads=1, codebook_size=2, block_len=1, window_bias=False)
    k = torch.ones(1, 1, 262, 8)  # every key lands on one code
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state, _ = attn(torch.randn(1, 1, 262, 8), k, torch.randn(1, 1, 262, 8))
    assert state.cache_n.dtype == torch.float64 and state.cache_mu.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert float(state.cache_n.max()) == 261.0  # odd and > 256: not representable in bf16


@pytest.mark.parametrize("bad", [{"block_len": 0}, {"codebook_size": 1}, {"window_len": 9, "block_len": 8}])
def test_bad_vq_options_are_refused(bad: dict) -> None:
    opts = {"d_k": 4, "d_v": 4, "heads": 1, "codebook_size": 8, "block_len": 8} | bad
    with pytest.raises(ValueError, match="|".join(bad)):
        build("vq", **opts)


# ----------------------------------------------------------------------------- the fused kernel


@pytest.mark.parametrize("one_block", [False, True])
@pytest.mark.parametrize("max_distance,span", [(None, None), (2, None), (2, 3)])
def test_window_index_columns_follow_each_key_distance(
    one_block: bool, max_distance: int | None, span: int | None
) -> None:
    """Rows at positions 1..3 of a block of 4: key ``j`` of the window (the previous block then their own, or
    their own alone) is ``d`` positions before row ``p``; its column is ``min(d, M + 1)`` (the bias, then zero),
    ``M + 2`` (masked) for a future key or one past the span; without the bias 0 or 1."""
    table = WindowIndex.of_block(4, 1, 3, one_block, max_distance, span).table()
    m = -1 if max_distance is None else max_distance
    assert table.shape == (3, 4 if one_block else 8)
    for p in range(3):
        for j in range(table.shape[1]):
            d = (1 + p) - j if one_block else (4 + 1 + p) - j
            hidden = d < 0 or (span is not None and d > span)
            assert table[p, j] == (m + 2 if hidden else min(d, m + 1)), (p, j)


@pytest.mark.parametrize("one_block", [False, True])
@pytest.mark.parametrize("max_distance,span", [(2, None), (2, 1), (4, None), (6, None), (6, 5)])
def test_window_keys_name_the_one_key_at_each_bias_distance(
    one_block: bool, max_distance: int, span: int | None
) -> None:
    """:meth:`WindowIndex.keys` inverts the table on its bias columns: row ``p``'s entry ``d`` is the window key the
    table puts in column ``d``, ``-1`` where no visible key is ``d`` before the row (before the window's start, or
    past the span), and every key of a bias column is named (``M`` below, at and above ``L = 4``)."""
    index = WindowIndex.of_block(4, 1, 3, one_block, max_distance, span)
    table, keys = index.table(), index.keys()
    assert keys.shape == (3, max_distance + 1)
    for p in range(3):
        for d in range(max_distance + 1):
            named = (table[p] == d).nonzero().flatten().tolist()
            assert named == ([] if keys[p, d] < 0 else [keys[p, d]]), (p, d)


def test_the_plain_kernel_gathers_the_distance_logits_gradient() -> None:
    """The XL bias's gradient reaches each distance logit from its one key, gathered: no scatter, whose additions
    of the keys beyond ``M`` into a dropped column are contended atomics on a GPU."""
    inputs = kernel_inputs(bias=True, cache=True)
    out = window_cache_attention(grouped(inputs), chunk=2)
    with OpLog() as log:
        out.backward(torch.randn_like(out))
    assert log.named("aten.gather") and not log.named(
        "aten.scatter_add_", "aten.scatter_add", "aten.index_add_"
    )


KERNEL_HEADS = 2  # query heads per item of :func:`kernel_inputs`


def kernel_inputs(bias: bool, cache: bool, rows: int = 4, items: int = 5, block: int = 4):
    """Random float64 inputs of :func:`window_cache_attention` (N=2, G=2, d_k=6, d_v=5, S=7, M=3)."""
    n, g, dk, dv, s, m = 2, KERNEL_HEADS, 6, 5, 7, 3
    mk = lambda *shape: torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    inputs = {
        "q": mk(n, items, g * rows, dk),
        "kb": mk(n, items + 1, block, dk),
        "vb": mk(n, items + 1, block, dv),
    }
    if bias:
        inputs |= {"bias_q": mk(n, items, g * rows, dk), "rel": mk(n, g, m + 1, dk)}
    if cache:
        counts = torch.randint(0, 3, (n, items, s)).double()
        inputs |= {
            "codebook": torch.randn(n, s, dk, dtype=torch.float64),
            "log_n": torch.where(counts > 0, counts.log(), float("-inf")),
            "mu": mk(n, items, s, dv),
        }
    return inputs


def grouped(inputs: dict) -> WindowInputs:
    """The kernels' inputs from :func:`kernel_inputs`' flat tensors (the bias and cache as their groups; item 0
    without a previous block; the rows at the end of their block, as in decoding)."""
    rows, block = inputs["q"].shape[2] // KERNEL_HEADS, inputs["kb"].shape[2]
    m = inputs["rel"].shape[2] - 1 if "rel" in inputs else None
    index = WindowIndex.of_block(block, block - rows, rows, False, m)
    bias = WindowBias(inputs["bias_q"], inputs["rel"]) if "rel" in inputs else None
    cache = CodeCache(inputs["codebook"], inputs["log_n"], inputs["mu"]) if "mu" in inputs else None
    return WindowInputs(inputs["q"], inputs["kb"], inputs["vb"], index, bias, cache, prev_masked=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("rows", [4, 1, 3])
def test_kernel_equals_plain_reference_for_every_chunk_size_fp64(bias: bool, cache: bool, rows: int) -> None:
    inputs = kernel_inputs(bias, cache, rows)
    wrt = [x for x in inputs.values() if x.requires_grad]
    ref = window_cache_reference(grouped(inputs))
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * g).sum(), wrt)
    for chunk in (1, 2, 3, 5, 8):
        out = window_cache_attention(grouped(inputs), chunk=chunk)
        assert torch.allclose(out, ref, atol=1e-12, rtol=0)
        grads = torch.autograd.grad((out * g).sum(), wrt)
        for name, got, want in zip(
            [k for k, x in inputs.items() if x.requires_grad], grads, ref_grads, strict=True
        ):
            assert torch.allclose(got, want, atol=1e-11, rtol=0), (name, chunk)
            assert want.abs().sum() > 0, name  # every input really receives a gradient


def test_kernel_passes_gradcheck() -> None:
    inputs = kernel_inputs(bias=True, cache=True, rows=2, items=3, block=2)
    inputs = {k: v.detach()[:1].requires_grad_(v.requires_grad) for k, v in inputs.items()}
    names = [k for k, v in inputs.items() if v.requires_grad]
    fn = lambda *xs: window_cache_attention(grouped(inputs | dict(zip(names, xs, strict=True))), chunk=2)
    assert torch.autograd.gradcheck(fn, [inputs[k] for k in names])


def test_kernel_under_bf16_autocast_tracks_fp32() -> None:
    inputs = {
        k: v.detach().float() if v.is_floating_point() else v for k, v in kernel_inputs(True, True).items()
    }
    ref = window_cache_reference(grouped(inputs))
    low = {k: v.bfloat16() if k in ("q", "kb", "vb", "bias_q", "rel") else v for k, v in inputs.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = window_cache_attention(grouped(low))
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref, atol=0.05, rtol=0.05)


def test_decoding_one_token_costs_one_row_not_a_padded_block() -> None:
    """A decoding step computes its own query row only: its matmuls are those of 1 position, not L."""
    from torch.utils.flop_counter import FlopCounterMode

    block, s, d = 64, 32, 16
    attn = build("vq", d_k=d, d_v=d, heads=1, codebook_size=s, block_len=block, window_bias=True)
    x = torch.randn(1, 1, 3 * block + 5, d)
    _, state, _ = attn(x, x, x)

    def flops(fn) -> int:
        with FlopCounterMode(display=False) as counter:
            fn()
        return counter.get_total_flops()

    step = flops(lambda: attn(x[:, :, :1], x[:, :, :1], x[:, :, :1], state))
    per_row = 2 * ((2 * block + s) * 2 * d + (block + 1) * d) + 2 * s * d  # scores, values, bias, code search
    assert step <= 2 * per_row + 2 * (block + 1) * d * d  # + the relative embeddings' projection


def test_running_code_means_equal_the_plain_recurrence_and_its_gradient() -> None:
    from tvq_exp.attention.vq.cache import running_code_means
    from tvq_exp.attention.vq.naive import running_code_means as running_code_means_reference

    n, r, L, s, dv = 3, 5, 4, 6, 3
    codes = torch.randint(0, s, (n, r, L))
    values = torch.randn(n, r, L, dv, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(r, L, dtype=torch.bool)
    valid[-1, 2:] = False  # padding never enters the cache
    n0 = torch.randint(0, 3, (n, s)).double()
    mu0 = torch.randn(n, s, dv, dtype=torch.float64) * (n0 > 0)[..., None]
    counts, means = running_code_means(codes, values, valid, n0, mu0)
    ref_counts, ref_means = running_code_means_reference(codes, values, valid, n0, mu0)
    assert torch.equal(counts, ref_counts)
    assert torch.allclose(means, ref_means, atol=1e-12, rtol=0)
    g = torch.randn_like(means)
    got = torch.autograd.grad((means * g).sum(), values)[0]
    want = torch.autograd.grad((ref_means * g).sum(), values)[0]
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    assert got[:, -1, 2:].abs().sum() == 0 and got.abs().sum() > 0
    # entry j holds the initial cache plus blocks 0..j-1: the totals check the bookkeeping
    assert torch.equal(counts[:, -1].sum(-1), n0.sum(-1) + valid.sum())


def test_the_cache_means_of_the_items_take_their_gradient_in_one_pass() -> None:
    """Item ``r`` reads the cache's prefix entry ``r - 1`` (items 0 and 1 both entry 0): the join of those entries
    (in the values' dtype) is one copy forward, and its gradient one pass back to the prefix. A join of two slices
    took the gradient of each slice, every one the whole prefix's size, then their sum. Counted by output size under
    a dispatch mode."""
    from tests.helpers.ops import OpLog

    b, t, h, d, block, s = 2, 40, 2, 8, 8, 4
    layer = build("vq", d_k=d, d_v=d, heads=h, codebook_size=s, block_len=block, use_cache=True)
    leaves = [torch.randn(b, t, h, d, requires_grad=True) for _ in range(3)]
    out = layer(*(x.transpose(1, 2) for x in leaves))[0]
    with OpLog() as log:
        out.sum().backward()
    prefix = (
        b * h * (t // block + 1) * s * d
    )  # the running means' entries: one per block, and the carried one
    assert not log.named("aten.slice_backward")
    assert [op.name for op in log.launches() if op.numel == prefix and op.name != "aten.new_empty"] == []
    assert leaves[2].grad.abs().sum() > 0  # the values' gradient passed through the means


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_layer_copies_keys_and_values_once_on_their_way_to_the_kernels(use_cache: bool) -> None:
    """Queries, keys and values as a model's projections give them (``(B, T, H, d)`` seen as ``(B, H, T, d)``): the
    layer copies the values once for the cache's means (not at all without the cache), the queries once into their
    items, and joins item 0's zero block in front of the window's keys and values, each join their one copy (no
    contiguous copy before it, and a join, whose gradient is a view, rather than a pad, whose gradient is a copy).
    Counted by output size under a dispatch mode: each copy is a full pass over memory on a GPU."""
    from collections import Counter

    from tests.helpers.ops import OpLog

    b, t, h, d, block = 2, 32, 2, 8, 8
    layer = build("vq", d_k=d, d_v=d, heads=h, codebook_size=4, block_len=block, use_cache=use_cache)
    q, k, v = (torch.randn(b, t, h, d, requires_grad=True).transpose(1, 2) for _ in range(3))
    with OpLog() as log:
        layer(q, k, v)
    copies = Counter(
        (op.name, op.numel) for op in log.named("aten.clone", "aten.constant_pad_nd", "aten.cat")
    )
    full, window = b * h * t * d, b * h * (t // block + 1) * block * d
    assert copies["aten.clone", full] == (2 if use_cache else 1)
    assert copies["aten.cat", window] == 2 and copies["aten.constant_pad_nd", window] == 0
