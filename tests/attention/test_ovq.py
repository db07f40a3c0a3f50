"""OVQ-attention: equals its token-loop reference (forward and gradients), is causal, streams and decodes
exactly like the parallel forward, and reports its state size and matmul FLOPs exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.attention.backends import build
from tests.attention.test_linear import check_against_reference, rel_err
from tvq_exp.attention.dense.naive import softmax_attention
from tvq_exp.attention.ovq import OVQAttention, OVQState
from tvq_exp.attention.ovq.naive import ovq_attention as ovq_reference
from tvq_exp.options import OptionError

B, H, D_K, D_V = 2, 4, 6, 5  # head dims deliberately not powers of two
# (T, block_len, num_centroids, growth_scale): the dictionary fills up and stays full / grows slowly /
# every absorbed key gets its own centroid
SHAPES = [(23, 4, 6, 2.0), (26, 3, 40, 3.0), (19, 5, 30, 1e9)]


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    torch.set_num_threads(1)


def make(
    dtype: torch.dtype = torch.float64, window_bias: bool = True, kv_heads: int = 2, **options
) -> OVQAttention:
    options = {"num_centroids": 6, "block_len": 4, "growth_scale": 2.0, "window_len": 3} | options
    attn = build("ovq", d_k=D_K, d_v=D_V, heads=H, window_bias=window_bias, kv_heads=kv_heads, **options).to(
        dtype
    )
    if window_bias:
        torch.nn.init.normal_(attn.bias.u)
        torch.nn.init.normal_(attn.bias.v)
    return attn


def inputs(
    t: int, kv_heads: int = 2, dtype: torch.dtype = torch.float64, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, D_K, generator=g, dtype=torch.float64)
    k = torch.randn(B, kv_heads, t, D_K, generator=g, dtype=torch.float64)
    v = torch.randn(B, kv_heads, t, D_V, generator=g, dtype=torch.float64)
    return tuple(x.to(dtype).requires_grad_(True) for x in (q, k, v))


def state_equal(a: OVQState, b: OVQState) -> bool:
    """The same position and exactly the same tensors, but the dictionary's values: running means taken as one
    prefix sum over the blocks (``vq.cache``), which a split call restarts from the carried mean, within 4 ulps
    of the largest."""
    eps = torch.finfo(a.values.dtype).eps
    close = torch.allclose(a.values, b.values, rtol=0, atol=4 * eps * float(b.values.abs().max()))
    return close and dataclasses.replace(a, values=b.values) == b


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "options",
    [
        {"window_bias": True, "seeding": "farthest", "kv_heads": 2},
        {"window_bias": False, "seeding": "first", "kv_heads": 1},
        {"window_bias": True, "seeding": "first", "kv_heads": 4, "grad_through_dictionary": False},
    ],
)
def test_equals_token_loop_reference(dtype: torch.dtype, shape: tuple, options: dict) -> None:
    t, block_len, size, scale = shape
    attn = make(dtype, block_len=block_len, num_centroids=size, growth_scale=scale, **options)
    qkv = inputs(t, options["kv_heads"], dtype)
    check_against_reference(attn, ovq_reference, dtype, options["kv_heads"], qkv)


def test_one_centroid_per_absorbed_key_is_exact_softmax_attention() -> None:
    """With room and growth for every key (``n(t) = t``), each absorbed key is its own centroid: OVQ is
    then plain causal softmax attention (no bias), a check independent of the reference."""
    attn = make(window_bias=False, num_centroids=64, block_len=4, growth_scale=1e9)
    q, k, v = inputs(31)
    out = attn(q, k, v)[0]
    assert rel_err(out, softmax_attention(q, k, v)) < 1e-12
    assert [attn.active_centroids(b) for b in range(4)] == [0, 4, 8, 12]


def test_dictionary_detached_keeps_forward_and_drops_its_gradient() -> None:
    on, off = make(), make(grad_through_dictionary=False)
    off.load_state_dict(on.state_dict())
    q, k, v = inputs(23)
    out_on, out_off = on(q, k, v)[0], off(q, k, v)[0]
    assert torch.equal(out_on, out_off)
    g_on, g_off = (torch.autograd.grad(out.sum(), v)[0] for out in (out_on, out_off))
    assert not torch.allclose(
        g_on, g_off
    )  # the values absorbed early reach the output only via the dictionary
    assert torch.equal(g_on[:, :, 16:], g_off[:, :, 16:])  # never absorbed: window gradient only


@pytest.mark.parametrize("window_bias", [False, True])
def test_causal_by_jacobian_and_by_perturbation(window_bias: bool) -> None:
    """Outputs before position ``s`` have zero gradient w.r.t. inputs at ``>= s`` and do not move when
    those inputs change (the discrete decisions included)."""
    attn = make(window_bias=window_bias)
    t = 23
    q, k, v = inputs(t)
    out = attn(q, k, v)[0]
    weights = torch.randn(out.shape, dtype=out.dtype)
    for s in (1, 4, 9, 14, 22):
        grads = torch.autograd.grad((out[:, :, :s] * weights[:, :, :s]).sum(), (q, k, v), retain_graph=True)
        for name, g in zip("qkv", grads, strict=True):
            assert torch.count_nonzero(g[:, :, s:]) == 0, (name, s)
        moved = [x.detach().clone() for x in (q, k, v)]
        for x in moved:
            x[:, :, s:] += 3 * torch.randn_like(x[:, :, s:])
        assert torch.equal(attn(*moved)[0][:, :, :s], out[:, :, :s].detach())


@pytest.mark.parametrize(
    "cuts", [[0, 5, 17, 29], [0, 1, 2, 3, 4, 9, 13, 29], [0, 12, 24, 29], list(range(30))], ids=str
)
def test_segments_and_token_by_token_equal_one_call(cuts: list[int]) -> None:
    attn = make(num_centroids=7, growth_scale=3.0)
    q, k, v = inputs(29)
    full, full_state, _ = attn(q, k, v)
    state, parts = None, []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        out, state, _ = attn(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state)
        parts.append(out)
    assert rel_err(torch.cat(parts, dim=2), full) < 1e-12
    assert state_equal(state, full_state)


def test_state_is_detached_bounded_and_counts_every_absorbed_position() -> None:
    attn = make(num_centroids=5)
    q, k, v = inputs(23)
    _, state, aux = attn(q, k, v)
    tensors = state.tensors()
    assert not any(x.requires_grad for x in tensors)
    absorbed = (23 // 4 - 1) * 4  # blocks 0..4 left the window
    assert torch.equal(state.counts.sum(-1), torch.full((B, 2), float(absorbed), dtype=torch.float64))
    assert state.k.shape[2] == 23 - 16  # from the start of the previous block
    assert 0 < aux["ovq_used"].item() <= 1 and not aux["ovq_used"].requires_grad


@pytest.mark.parametrize("t", [1, 3, 4, 7, 8, 11, 12, 23, 40])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_state_floats_count_the_returned_state(t: int, kv_heads: int) -> None:
    attn = make(kv_heads=kv_heads)
    _, state, _ = attn(*inputs(t, kv_heads))
    floats = sum(x.numel() for x in state.tensors())
    assert floats == B * attn.state_floats(t)


@pytest.mark.parametrize("t", [1, 4, 7, 8, 9, 13, 23])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("window_bias,kv_heads", [(False, 1), (True, 2)])
def test_flops_equal_flop_counter(t: int, backward: bool, window_bias: bool, kv_heads: int) -> None:
    attn = make(torch.float32, window_bias=window_bias, kv_heads=kv_heads, num_centroids=7)
    q, k, v = inputs(t, kv_heads, torch.float32)
    with FlopCounterMode(display=False) as counter:
        out = attn(q, k, v)[0]
        if backward:
            out.sum().backward()
    assert counter.get_total_flops() == attn.flops(t, batch=B, backward=backward)


def test_decoding_one_token_costs_one_row() -> None:
    """A decoding step (no block completed, no bias) runs its own query row: ``2L + S`` keys per head."""
    L, S = 4, 7
    attn = make(torch.float32, window_bias=False, num_centroids=S, block_len=L)
    q, k, v = inputs(14, dtype=torch.float32)
    _, state, _ = attn(q[:, :, :13], k[:, :, :13], v[:, :, :13])
    with FlopCounterMode(display=False) as counter:
        attn(q[:, :, 13:], k[:, :, 13:], v[:, :, 13:], state)
    assert counter.get_total_flops() == B * H * 2 * (2 * L + S) * (D_K + D_V)


def test_bf16_autocast_keeps_the_state_in_fp32() -> None:
    attn = make(torch.float32)
    q, k, v = (x.detach().bfloat16() for x in inputs(23, dtype=torch.float32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, state, _ = attn(q, k, v)
    ref, _, _ = attn(q.float(), k.float(), v.float())
    assert out.dtype == torch.bfloat16 and state.keys.dtype == torch.float32
    assert state.counts.dtype == torch.float64  # exact integer counts at any length
    assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_growth_plateaus_and_adds_at_most_a_block() -> None:
    attn = OVQAttention(d_k=D_K, d_v=D_V, num_centroids=50, block_len=8)  # default growth_scale: S / 4
    counts = [attn.active_centroids(b) for b in range(200)]
    steps = [b - a for a, b in zip(counts[:-1], counts[1:], strict=True)]
    assert counts[0] == 0 and counts[-1] == 50 and all(0 <= s <= 8 for s in steps)
    assert steps[0] > steps[20] > 0  # logarithmic: fast at first, slower later, until the cap


@pytest.mark.parametrize("seeding", ["farthest", "first"])
def test_a_state_moved_to_its_equivalent_position_continues_as_where_it_is(seeding: str) -> None:
    """Every centroid is in use after 6 blocks here (``S = 6``, ``L = 4``, ``α = 2``): from position 28 on a state
    continues as one at ``28 + t mod 4`` (the same outputs, the next state moved by as much), for continuations of
    one position and of two blocks and one; before 28 no position is equivalent to another."""
    attn = make(seeding=seeding)
    assert attn.full_block() == 6 and [attn.active_centroids(b) for b in (5, 6)] == [5, 6]
    assert [attn.equivalent_position(t) for t in (27, 28, 31, 32, 45)] == [27, 28, 31, 28, 29]
    q, k, v = (x.detach() for x in inputs(50))
    for t in range(24, 41):
        _, state, _ = attn(q[:, :, :t], k[:, :, :t], v[:, :, :t])
        moved = attn.equivalent_position(t)
        for t_new in (1, 9):
            rest = (q[:, :, t : t + t_new], k[:, :, t : t + t_new], v[:, :, t : t + t_new])
            out, after, _ = attn(*rest, state)
            moved_out, moved_after, _ = attn(*rest, state.moved(moved - t))
            assert torch.equal(moved_out, out), (t, t_new)
            assert moved_after.moved(t - moved) == after, (t, t_new)


def test_a_dictionary_that_never_fills_claims_no_equivalent_position() -> None:
    """``α·(e^((S − 1)/α) − 1)`` positions past 2⁴⁰·α: no block fills it, every position is its own."""
    attn = make(num_centroids=512, growth_scale=1.0)
    assert attn.full_block() is None and attn.equivalent_position(2**62) == 2**62


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"causal": False}, "causal=False: must be True"),
        ({"num_centroids": 0}, "num_centroids=0: must be >= 1"),
        ({"block_len": 0}, "block_len=0: must be >= 1"),
        ({"window_len": 5}, "window_len=5: must be <= block_len=4"),
        ({"window_len": -1}, "window_len=-1: must be >= 0"),
        ({"growth_scale": 0.0}, "growth_scale=0.0: must be > 0"),
        ({"growth_scale": float("inf")}, "growth_scale=inf: must be > 0, and finite"),
        ({"seeding": "random"}, "seeding='random': must be one of farthest, first"),
        ({"kv_heads": 3}, "kv_heads=3: must divide heads=4"),
    ],
)
def test_bad_options_are_refused(bad: dict, message: str) -> None:
    with pytest.raises(OptionError, match=f"^OVQAttention: {message}"):
        make(**bad)


def test_bad_input_shapes_are_refused() -> None:
    attn = make()
    q, k, v = inputs(5)
    with pytest.raises(ValueError, match="kv_heads=2"):
        attn(q, k[:, :1], v[:, :1])
