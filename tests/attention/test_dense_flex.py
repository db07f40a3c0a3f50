"""Dense attention through flex_attention (:mod:`tvq_exp.attention.dense.flex`) equals the plain explicit-logit
path of :class:`~tvq_exp.attention.dense.DenseAttention`: forward and gradients (q, k, v and the XL bias
parameters u, v, W_r), fp32, causal, with a past offset, and for encoders.

On CPU the compiled (fused) kernel is forward-only, so gradients are checked through the eager flex
implementation (same ``score_mod``/``BlockMask``, math backward); on CUDA the compiled kernel is used.
Each compiled case costs one inductor compile. Measured on the 2-core CPU with a cold inductor cache:
21 s for the first (inductor start-up included), 6.6 s and 8.5 s for the next two; with a warm cache
(``/tmp/torchinductor_$USER``) 3 s, 0.5 s, 0.5 s. So the compiled-forward checks are marked ``slow``;
the eager checks (forward and gradients, same score_mod and BlockMask) run in ~4 s.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.attention.backends import build
from tests.helpers.xl_bias import content_query, xl_bias_matrix
from tvq_exp.attention.base import causal_mask
from tvq_exp.attention.dense.flex import SPARSE_BLOCK, block_mask, causal_mask_mod
from tvq_exp.attention.dense.naive import softmax_attention
from tvq_exp.attention.flex_runtime import (
    FLEX_AVAILABLE,
    FLEX_CUDA_WIDE_BACKWARD,
    FlexUnsupported,
    flex_kernel_options,
    flex_support,
)

pytestmark = [
    pytest.mark.skipif(not FLEX_AVAILABLE, reason="torch has no flex_attention"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
M = 5  # the XL bias window
ATOL = RTOL = 1e-5
CASES = [  # (causal, past)
    pytest.param(True, 0, id="causal"),
    pytest.param(True, 7, id="causal-past7"),
    pytest.param(False, 0, id="encoder"),
]


def _dims(device: str, compiled: bool = False) -> tuple[int, int]:
    """``d_k, d_v``: small on CPU, but not 8 or 16 for its compiled kernel; on CUDA at least 16, the compiled kernel's
    smallest head."""
    if device == "cuda":
        return 16, 24
    return (32, 40) if compiled else (8, 4)


def _dense(causal: bool, device: str, compiled: bool = False):
    d_k, d_v = _dims(device, compiled)
    attn = build("dense", d_k=d_k, d_v=d_v, heads=2, causal=causal, window_bias=True, window_len=M).to(device)
    torch.nn.init.normal_(attn.bias.u)  # zero at init: make the bias terms matter
    torch.nn.init.normal_(attn.bias.v)
    return attn


def _qkv(t_q: int, past: int, device: str, compiled: bool = False):
    d_k, d_v = _dims(device, compiled)
    q = torch.randn(2, 2, t_q, d_k, device=device, requires_grad=True)
    k = torch.randn(2, 2, t_q + past, d_k, device=device, requires_grad=True)
    v = torch.randn(2, 2, t_q + past, d_v, device=device, requires_grad=True)  # d_v != d_k
    return q, k, v


def _close(
    out: torch.Tensor, ref: torch.Tensor, params: tuple[torch.Tensor, ...] = (), tol: float = ATOL
) -> None:
    """``out`` equals ``ref`` (flex's tolerance), and so do their gradients to ``params`` (by position in a
    failure's message)."""
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    if not params:
        return
    g = torch.randn_like(ref)
    grads = torch.autograd.grad((out * g).sum(), params)
    ref_grads = torch.autograd.grad((ref * g).sum(), params)
    for i, (a, b) in enumerate(zip(grads, ref_grads, strict=True)):
        assert a is not None, f"no gradient to parameter {i}"
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, i=i: f"gradient {i}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("causal", "past"), CASES)
def test_flex_gradients_equal_plain_path(causal: bool, past: int, device: str) -> None:
    attn = _dense(causal, device)
    q, k, v = _qkv(19, past, device)
    params = (q, k, v, attn.bias.u, attn.bias.v, attn.bias.proj.weight)
    ref = attn.attend_plain(q, k, v, past)  # explicit logits + bias + masked softmax
    out = attn.attend_flex(q, k, v, past)  # CPU: eager flex; CUDA: compiled
    _close(out, ref, params)  # q, k, v, u, v (bias), W_r


@pytest.mark.parametrize(("causal", "past"), CASES)
def test_flex_with_attention_window_equals_plain_path(causal: bool, past: int) -> None:
    attn = build(
        "dense", d_k=8, d_v=4, heads=2, causal=causal, window_bias=True, window_len=M, attention_window=4
    )
    torch.nn.init.normal_(attn.bias.u)
    torch.nn.init.normal_(attn.bias.v)
    q, k, v = _qkv(17, past, "cpu")
    params = (q, k, v, attn.bias.u, attn.bias.v, attn.bias.proj.weight)
    ref = attn.attend_plain(q, k, v, past)
    out = attn.attend_flex(q, k, v, past)
    _close(out, ref, params)


def test_flex_equals_explicit_bias_matrix() -> None:
    """An independent reference: softmax((q + s·u)·kᵀ + the XL bias matrix from its formula)·v."""
    attn = _dense(True, "cpu")
    q, k, v = _qkv(16, 0, "cpu")
    bias = xl_bias_matrix(attn.bias, q, causal=True)
    ref = softmax_attention(content_query(attn.bias, q), k, v, causal=True, bias=bias)
    out = attn.attend_flex(q, k, v)
    _close(out, ref, (q, k, v, attn.bias.u, attn.bias.v, attn.bias.proj.weight))


def test_flex_without_bias_equals_sdpa_path() -> None:
    attn = build("dense", d_k=8, d_v=4, heads=2)
    q, k, v = _qkv(13, 6, "cpu")
    ref = attn.attend_plain(q, k, v, 6)  # scaled_dot_product_attention with a boolean mask
    out = attn.attend_flex(q, k, v, 6)
    _close(out, ref, (q, k, v))


def _compiled_forward(causal: bool, past: int) -> None:
    if not flex_support("cpu", compiled=True):
        pytest.skip(flex_support("cpu", compiled=True).reason)
    attn = _dense(causal, "cpu", compiled=True)
    q, k, v = _qkv(24, past, "cpu", compiled=True)
    with torch.no_grad():
        ref = attn.attend_plain(q, k, v, past)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = attn.attend_flex(q, k, v, past, compiled=True)
    _close(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize(("causal", "past"), CASES)
def test_compiled_flex_forward_equals_plain_path(causal: bool, past: int) -> None:
    _compiled_forward(causal, past)


@pytest.mark.parametrize(
    ("past", "window", "causal"), [(0, None, True), (5, None, True), (3, 4, True), (0, 3, False)]
)
def test_mask_mod_matches_causal_mask(past: int, window: int | None, causal: bool) -> None:
    from torch.nn.attention.flex_attention import create_mask

    t_q, t_k = 9, 9 + past
    mask = create_mask(causal_mask_mod(past, causal, window), None, None, t_q, t_k, device="cpu")[0, 0]
    distance = torch.arange(t_q)[:, None] + past - torch.arange(t_k)[None, :]
    expected = (
        causal_mask(t_q, t_k, past, torch.device("cpu")) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    )
    if window is not None:
        expected &= distance.abs() <= window
    assert torch.equal(mask, expected)


@pytest.mark.parametrize(
    ("t_q", "t_k", "past", "window", "causal"),
    [
        (300, 300, 0, None, True), (256, 512, 256, None, True), (200, 331, 131, None, True),
        (384, 384, 0, 100, True), (300, 700, 400, 250, True), (520, 520, 0, 128, True),
        (300, 300, 0, 150, False), (256, 384, 128, 127, False), (129, 129, 0, 1, True),
    ],
)  # fmt: skip
def test_the_block_mask_is_the_one_torch_builds_from_the_mask(
    t_q: int, t_k: int, past: int, window: int | None, causal: bool
) -> None:
    """:func:`block_mask` builds its blocks from distances, not from the ``(t_q, t_k)`` mask; it equals what torch's
    ``create_block_mask`` makes of :func:`causal_mask_mod`: the same partial and full blocks in the same order, both
    ways (keys per query block, queries per key block), and the same elementwise mask. Lengths off the 128-block
    grid, past offsets, windows of a block and off it, encoders."""
    from torch.nn.attention.flex_attention import create_block_mask

    ours = block_mask(t_q, t_k, "cpu", past=past, causal=causal, window=window)
    torch_mask = create_block_mask(causal_mask_mod(past, causal, window), None, None, t_q, t_k, device="cpu")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices"):  # fmt: skip
        assert torch.equal(getattr(ours, name), getattr(torch_mask, name)), name
    assert ours.seq_lengths == torch_mask.seq_lengths and ours.BLOCK_SIZE == torch_mask.BLOCK_SIZE
    assert torch.equal(ours.to_dense(), torch_mask.to_dense())


def test_the_block_mask_of_a_long_sequence_needs_no_elementwise_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """At T = 128k the elementwise mask torch's ``create_block_mask`` evaluates is 16 GiB (the allocation that failed
    on an H200, 2026-11-29); :func:`block_mask` builds the causal mask from its 1024 × 1024 blocks, never evaluating
    the elementwise one (torch's ``create_mask`` refuses here): block row ``i`` has ``i`` full blocks and its
    diagonal one partial."""
    import torch.nn.attention.flex_attention as flex

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the elementwise T x T mask was evaluated")

    monkeypatch.setattr(flex, "create_mask", refuse)
    t = 131072 + SPARSE_BLOCK  # a length no other test builds (the masks are cached)
    mask = block_mask(t, t, "cpu")
    rows = torch.arange(t // SPARSE_BLOCK, dtype=torch.int32)
    assert torch.equal(mask.full_kv_num_blocks[0, 0], rows)
    assert torch.equal(mask.kv_num_blocks[0, 0], torch.ones_like(rows))
    assert torch.equal(mask.kv_indices[0, 0, :, 0], rows)


def test_unsupported_options_say_why() -> None:
    relu2 = build("dense", d_k=4, d_v=4, score="relu2")
    assert not relu2.flex_support("cpu")
    assert "not softmax" in relu2.flex_support("cpu").reason
    talking = build("dense", d_k=4, d_v=4, heads=2, talking_heads=True)
    assert "talking heads" in talking.flex_support("cpu").reason
    with pytest.raises(FlexUnsupported, match="not softmax"):
        relu2.attend_flex(*(torch.randn(1, 1, 4, 4) for _ in range(3)))
    on_cpu = flex_support("cpu", requires_grad=True, compiled=True)
    assert not on_cpu and "backward on CPU" in on_cpu.reason
    assert flex_support("cpu", requires_grad=True, compiled=False)
    assert "not meta" in flex_support("meta").reason
    narrow = flex_support("cuda", compiled=True, head_dims=(8, 8, 6))  # torch's CUDA kernel needs >= 16
    assert not narrow and "at least 16 (q, k, v: 8, 8, 6)" in narrow.reason
    assert flex_support("cuda", compiled=False, head_dims=(8, 8, 6))  # the eager form has no such limit
    narrow_cpu = flex_support("cpu", compiled=True, head_dims=(8, 8, 6))  # torch's CPU kernel is wrong there
    assert (
        not narrow_cpu
        and "heads of 8 or 16 (torch" in narrow_cpu.reason
        and "q, k, v: 8, 8, 6" in narrow_cpu.reason
    )
    assert flex_support("cpu", compiled=False, head_dims=(8, 8, 6))


def test_wide_cuda_heads_get_smaller_backward_blocks() -> None:
    """torch's default CUDA backward blocks do not fit the shared memory for heads wider than 128 (the GAU's d_v):
    such calls with gradients get FLEX_CUDA_WIDE_BACKWARD; other calls, and every CPU call, keep torch's defaults."""
    assert flex_kernel_options("cuda", (128, 128, 256), backward=True) == FLEX_CUDA_WIDE_BACKWARD
    assert flex_kernel_options("cuda:0", (256, 256, 64), backward=True) == FLEX_CUDA_WIDE_BACKWARD
    assert flex_kernel_options("cuda", (128, 128, 256), backward=False) is None  # the forward fits as it is
    assert flex_kernel_options("cuda", (128, 128, 128), backward=True) is None
    assert flex_kernel_options("cpu", (128, 128, 256), backward=True) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_flex_trains_wide_heads_on_cuda() -> None:
    """The compiled CUDA backward at the GAU's width (d_k 128, d_v 256, XL bias): it runs (torch's default blocks
    ran out of shared memory) and its gradients equal the plain path's, in fp32."""
    attn = build("dense", d_k=128, d_v=256, heads=1, window_bias=True, window_len=M).to("cuda")
    torch.nn.init.normal_(attn.bias.u)
    torch.nn.init.normal_(attn.bias.v)
    q = (torch.randn(1, 1, 256, 128, device="cuda") / 128**0.25).requires_grad_()
    k = (torch.randn(1, 1, 256, 128, device="cuda") / 128**0.25).requires_grad_()
    v = torch.randn(1, 1, 256, 256, device="cuda", requires_grad=True)
    ref = attn.attend_plain(q, k, v, 0)
    out = attn.attend_flex(q, k, v, 0, compiled=True)
    _close(out, ref, (q, k, v, attn.bias.u, attn.bias.v), tol=1e-4)  # sums over 128-256 terms


def test_the_kernel_option_dispatches_and_streams_like_the_plain_path() -> None:
    """``kernel=flex`` through the backend's own forward (the eager flex path with gradients on CPU): outputs and
    gradients equal ``kernel=plain``, also streamed in two segments with the state carried; ``last_kernel`` says
    which ran; ``auto`` keeps the plain path where the compiled kernel cannot run (CPU with gradients)."""
    plain = _dense(True, "cpu")
    flex = build("dense", d_k=8, d_v=4, heads=2, window_bias=True, window_len=M, kernel="flex")
    flex.load_state_dict(plain.state_dict())
    q, k, v = _qkv(12, 0, "cpu")
    outs, grads = [], []
    for attn in (plain, flex):
        first, state, _ = attn(q[:, :, :5], k[:, :, :5], v[:, :, :5])
        second, _, _ = attn(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], state)
        out = torch.cat([first, second], dim=2)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v, attn.bias.u)))
    assert flex.last_kernel == "flex" and plain.last_kernel == "plain"
    _close(outs[1], outs[0])
    for ours, ref in zip(grads[1], grads[0], strict=True):
        _close(ours, ref)
    auto = build("dense", d_k=8, d_v=4, heads=2, window_bias=True, window_len=M, kernel="auto")
    auto(q, k, v)
    assert auto.last_kernel == "plain"  # gradients on CPU: no compiled flex kernel
    with torch.no_grad():
        auto(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    assert auto.last_kernel == "plain"  # a decoding step: fewer queries than FLEX_MIN_QUERIES


def test_the_flex_kernel_refuses_what_it_cannot_express() -> None:
    attn = build("dense", d_k=8, d_v=4, heads=2, score="relu2", kernel="flex")
    q, k, v = _qkv(6, 0, "cpu")
    with pytest.raises(FlexUnsupported, match="not softmax"):
        attn(q, k, v)
