"""Transformer-VQ's window + cache step through flex attention (:mod:`tvq_exp.attention.vq.flex`) equals the
plain kernel (:mod:`tvq_exp.attention.vq.kernel`, itself held equal to the naive reference and the official
code): forward and every gradient (queries, keys, values, the XL bias parameters), fp32, with and without
the bias and the cache, grouped query heads, the gradient through the cache on and off, and streamed in
segments with the state carried.

On CPU the compiled kernel is forward-only, so gradients go through flex's eager form (the same
``score_mod`` and block mask); one compiled forward (the path ``kernel=auto`` takes for inference on CPU)
runs here, the others are ``slow`` (an inductor compile each, seconds on 2 cores).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.attention.backends import build
from tvq_exp.attention.flex_runtime import (
    FLEX_AVAILABLE,
    FLEX_MIN_QUERIES,
    FlexSupport,
    flex_support,
)

pytestmark = [
    pytest.mark.skipif(not FLEX_AVAILABLE, reason="torch has no flex_attention"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

ATOL = RTOL = 1e-5
# on CUDA the compiled kernel, gradients too
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# d_k, d_v: the compiled CUDA kernel needs heads of at least 16, the compiled CPU kernel none of 8 or 16 (``cpu-compiled``)
DIMS = {"cpu": (8, 6), "cpu-compiled": (32, 40), "cuda": (16, 24)}
SEGMENTS = (3, 5, 1, 7, 4)  # uneven: partial blocks, one token, several blocks, a carried state throughout


def _dims(device: str, compiled: bool) -> tuple[int, int]:
    """``d_k, d_v`` on ``device``; on CPU, wide enough for the compiled kernel where ``compiled``."""
    return DIMS["cpu-compiled" if compiled and device == "cpu" else device]


def _pair(
    bias: bool, cache: bool, grad_through_cache: bool = True, heads: int = 2, device: str = "cpu",
    compiled: bool = False,
) -> tuple:  # fmt: skip
    """Two VQ layers with the same parameters and codebook: ``kernel=plain`` and ``kernel=flex``."""
    torch.manual_seed(0)
    d_k, d_v = _dims(device, compiled)
    plain = build(
        "vq", d_k=d_k, d_v=d_v, heads=heads, kv_heads=1, codebook_size=5, block_len=4, window_len=3,
        window_bias=bias, use_cache=cache, grad_through_cache=grad_through_cache,
    )  # fmt: skip
    if bias:  # zero at init: make the bias terms matter
        torch.nn.init.normal_(plain.bias.u)
        torch.nn.init.normal_(plain.bias.v)
    plain.to(device).eval()  # the codebook does not move between the two calls
    flex = copy.deepcopy(plain)
    flex.kernel = "flex"
    return plain, flex


def _stream(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """Outputs of ``SEGMENTS`` consecutive calls with the state carried, and the final state."""
    outs, state, start = [], None, 0
    for length in SEGMENTS:
        part = slice(start, start + length)
        out, state, _ = attn(q[:, :, part], k[:, :, part], v[:, :, part], state)
        outs.append(out)
        start += length
    return torch.cat(outs, dim=2), state


def _inputs(
    heads: int = 2, length: int = sum(SEGMENTS), device: str = "cpu", compiled: bool = False
) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    d_k, d_v = _dims(device, compiled)
    q = torch.randn(2, heads, length, d_k).to(device).requires_grad_()
    k = torch.randn(2, 1, length, d_k).to(device).requires_grad_()
    v = torch.randn(2, 1, length, d_v).to(device).requires_grad_()
    return q, k, v


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("grad_through_cache", [True, False], ids=["grad-cache", "no-grad-cache"])
@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("bias", [True, False], ids=["xl", "no-bias"])
@pytest.mark.parametrize("device", DEVICES)
def test_flex_forward_and_gradients_equal_the_plain_kernel(
    device: str, bias: bool, cache: bool, grad_through_cache: bool
) -> None:
    plain, flex = _pair(bias, cache, grad_through_cache, device=device)
    q, k, v = _inputs(device=device)
    results = []
    for attn in (plain, flex):
        out, _, _ = attn(q, k, v)  # 19 positions: 5 blocks of 4, the cache used from block 2 on
        params = [q, k, v, *(p for p in attn.parameters() if p.requires_grad)]
        weights = torch.linspace(-1, 1, out.numel(), device=device).view_as(out)
        grads = torch.autograd.grad((out * weights).sum(), params, allow_unused=True)
        results.append((out, grads))
    assert (plain.last_kernel, flex.last_kernel) == ("plain", "flex")
    _close(results[1][0], results[0][0])
    for ours, ref in zip(results[1][1], results[0][1], strict=True):
        assert (ours is None) == (ref is None)
        if ref is not None:
            _close(ours, ref)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_flex_streams_like_the_plain_kernel(cache: bool) -> None:
    """Segments of 3, 5, 1, 7, 4 positions with the state carried: outputs, the carried state and the
    gradients equal the plain kernel's (gradients on: flex's eager form on CPU)."""
    plain, flex = _pair(True, cache)
    q, k, v = _inputs()
    (out_p, state_p), (out_f, state_f) = _stream(plain, q, k, v), _stream(flex, q, k, v)
    _close(out_f, out_p)
    assert type(state_f) is type(state_p) and state_f.position == state_p.position
    for ours, ref in zip(state_f.tensors(), state_p.tensors(), strict=True):
        _close(ours, ref)
    for ours, ref in zip(torch.autograd.grad(out_f.square().sum(), (q, k, v)),
                         torch.autograd.grad(out_p.square().sum(), (q, k, v)), strict=True):  # fmt: skip
        _close(ours, ref)


def _compiled_forward(bias: bool, cache: bool, kernel: str = "flex", length: int = 24) -> None:
    support = flex_support("cpu", compiled=True)
    if not support:
        pytest.skip(support.reason)
    plain, flex = _pair(bias, cache, compiled=True)
    flex.kernel = kernel  # inference on CPU: the compiled kernel
    q, k, v = (x.detach() for x in _inputs(length=length, compiled=True))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, _, _ = plain(q, k, v)
        out, _, _ = flex(q, k, v)
    assert flex.last_kernel == "flex"
    _close(out, expected)


def test_compiled_flex_forward_equals_the_plain_kernel() -> None:
    """The path ``kernel=auto`` takes for inference on CPU (calls of at least 128 queries): the compiled flex
    kernel (XL bias, the cache, grouped heads). With gradients on CPU, or for a short call (a decoding step),
    ``auto`` keeps the plain kernel."""
    _compiled_forward(bias=True, cache=True, kernel="auto", length=FLEX_MIN_QUERIES)
    plain, auto = _pair(True, True, compiled=True)
    auto.kernel = "auto"
    auto(*_inputs(compiled=True))  # gradients on CPU
    assert auto.last_kernel == "plain"
    with torch.no_grad():
        auto(*(x[:, :, :1] for x in _inputs(compiled=True)))  # one query
    assert auto.last_kernel == "plain"


@pytest.mark.slow
@pytest.mark.parametrize(("bias", "cache"), [(True, False), (False, True), (False, False)])
def test_compiled_flex_forward_equals_the_plain_kernel_in_every_form(bias: bool, cache: bool) -> None:
    _compiled_forward(bias, cache)


def test_the_kernel_option_is_validated() -> None:
    with pytest.raises(ValueError, match="kernel"):
        build("vq", d_k=8, d_v=6, codebook_size=5, block_len=4, kernel="triton")


def test_decoding_past_the_recompile_limit_falls_back_to_eager_flex() -> None:
    """Token-by-token decoding gives every call a new shape; past TorchDynamo's recompile limit (here 1) the
    compiled kernel would raise (``fullgraph=True``): the call runs flex's eager form instead, same result."""
    support = flex_support("cpu", compiled=True)
    if not support:
        pytest.skip(support.reason)
    plain, flex = _pair(True, True, compiled=True)
    q, k, v = (x.detach() for x in _inputs(length=11, compiled=True))
    outs = []
    with torch.no_grad(), warnings.catch_warnings(), torch._dynamo.config.patch(recompile_limit=1):
        warnings.simplefilter("ignore")
        for attn in (plain, flex):
            state, steps = None, []
            for t in range(q.shape[2]):  # one position at a time: rows and window widths change
                out, state, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
                steps.append(out)
            outs.append(torch.cat(steps, dim=2))
    assert flex.last_kernel == "flex"
    _close(outs[1], outs[0])


@pytest.mark.parametrize("kernel", ["auto", "flex"])
@pytest.mark.parametrize("backend", ["vq", "dense"])
def test_the_kernel_choice_reads_whether_flex_runs_without_asking_its_truth(
    backend: str, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch 2.11's compiler cannot call a frozen dataclass's ``__bool__``: on the H200 of 2026-11-30 every compiled
    VQ block broke its graph at the kernel choice (``bool(FlexSupport)``). The choice and flex's own check read
    :attr:`FlexSupport.ok`; a call that asked for the support's truth fails here."""

    def refuse(self: FlexSupport) -> bool:
        raise AssertionError("FlexSupport's truth asked for: read .ok (torch 2.11 cannot compile __bool__)")

    torch.manual_seed(0)
    d_k, d_v = _dims("cpu", compiled=True)
    attn = build(backend, d_k=d_k, d_v=d_v, heads=2, kernel=kernel, **(
        {"codebook_size": 5, "kv_heads": 1, "block_len": 4} if backend == "vq" else {}
    ))  # fmt: skip
    # the construction's checks run eager: only the call's are watched
    monkeypatch.setattr(FlexSupport, "__bool__", refuse)
    q, k, v = _inputs(length=FLEX_MIN_QUERIES, compiled=True)
    if backend == "dense":
        k, v = k.expand(-1, 2, -1, -1), v.expand(-1, 2, -1, -1)
    # on CPU ``auto`` takes flex without gradients (the compiled kernel); ``flex`` runs with them too
    with warnings.catch_warnings(), torch.set_grad_enabled(kernel == "flex"):
        warnings.simplefilter("ignore")
        out, _, _ = attn(q, k, v, None)
    assert attn.last_kernel == "flex" and torch.isfinite(out).all()
