"""The fused Triton kernel of Transformer-VQ's window + cache step (``tvq_exp.attention.vq.fused``), run on CPU under
Triton's interpreter (and compiled on CUDA where there is one): equal to the plain kernel and the naive reference in
fp32 (forward and every gradient, relative error <= 1e-5) in every case the plain kernel covers, within 1e-2 with
bf16 operands, and through the layer (``kernel=triton``) equal to ``kernel=plain``, streamed and causal; refused in
one line where it cannot run; taken by ``kernel=auto`` on CUDA only for values of two forward chunks. The sm_90a
compile report (no spills, no repeated products) is a slow test (``make kernel-report``); how it counts repeated
products is a fast one."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from tests.attention.backends import build
from tests.helpers.descriptors import count_descriptors
from tests.helpers.paths import REPO
from tvq_exp.attention.vq import layer as vq_layer
from tvq_exp.attention.vq.fused import config, fused_window_cache_attention, op
from tvq_exp.attention.vq.fused.config import KERNEL_NAMES, SHIPPED, Tiles, tiles
from tvq_exp.attention.vq.fused.report import repeats
from tvq_exp.attention.vq.fused.support import wants_triton
from tvq_exp.attention.vq.kernel import (
    CodeCache,
    WindowBias,
    WindowIndex,
    WindowInputs,
    window_cache_attention,
)
from tvq_exp.attention.vq.naive import window_cache_attention as naive_window_cache_attention
from tvq_exp.options import OptionError

TOL = 1e-5  # relative error of fp32 results (‖got - want‖ / ‖want‖)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Every CPU test here runs the kernel under Triton's interpreter (the refusal test lifts it)."""
    params = getattr(request.node, "callspec", None)
    if params is None or params.params.get("device", "cpu") == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class Case:
    """Sizes of one kernel call: ``n`` sequences, ``items`` query blocks of ``g`` heads × ``rows`` positions (the
    last ``rows`` of a block of ``block``), ``d_k``, ``d_v``, ``s`` codes, XL bias over ``m`` distances."""

    bias: bool = True
    cache: bool = True
    rows: int = 4
    block: int = 4
    g: int = 2
    items: int = 3
    n: int = 2
    d_k: int = 6
    d_v: int = 5
    s: int = 7
    m: int = 3
    one_block: bool = False  # a sequence's lone first block: the window is block i alone
    per_item_codes: bool = False  # cache_key_grad's per-item codebook, with a gradient
    span: int | None = None  # a sliding window (use_cache=False)
    prev_grad: bool = True


def make_inputs(
    case: Case, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Random inputs of :func:`window_cache_attention` for ``case`` (flat; :func:`grouped` groups them)."""
    c = case
    mk = lambda *shape: torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)
    blocks = 1 if c.one_block else 2
    inputs = {
        "q": mk(c.n, c.items, c.g * c.rows, c.d_k),
        "kb": mk(c.n, c.items + blocks - 1, c.block, c.d_k),
        "vb": mk(c.n, c.items + blocks - 1, c.block, c.d_v),
    }
    if c.bias:
        inputs |= {"bias_q": mk(c.n, c.items, c.g * c.rows, c.d_k), "rel": mk(c.n, c.g, c.m + 1, c.d_k)}
    if c.cache:
        counts = torch.randint(0, 3, (c.n, c.items, c.s), device=device).float()
        codes = (c.n, c.items, c.s, c.d_k) if c.per_item_codes else (c.n, c.s, c.d_k)
        inputs |= {
            "codebook": mk(*codes) if c.per_item_codes else torch.randn(*codes, dtype=dtype, device=device),
            "log_n": torch.where(counts > 0, counts.log(), float("-inf")),
            # fp32, as the layer's cache means
            "mu": torch.randn(c.n, c.items, c.s, c.d_v, device=device).requires_grad_(),
        }
    return inputs


def window(case: Case) -> WindowIndex:
    """The window of ``case``'s rows: the last ``rows`` positions of their block."""
    c = case
    return WindowIndex.of_block(
        c.block, c.block - c.rows, c.rows, c.one_block, c.m if c.bias else None, c.span
    )


def grouped(inputs: dict[str, torch.Tensor], case: Case) -> WindowInputs:
    bias = WindowBias(inputs["bias_q"], inputs["rel"]) if "rel" in inputs else None
    cache = CodeCache(inputs["codebook"], inputs["log_n"], inputs["mu"]) if "mu" in inputs else None
    return WindowInputs(
        inputs["q"], inputs["kb"], inputs["vb"], window(case), bias, cache, prev_masked=not case.one_block
    )


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


def outputs_and_grads(fn, inputs: dict, case: Case, g: torch.Tensor | None = None):  # noqa: ANN001, ANN201
    """``fn``'s output and the gradients of ``Σ out·g`` w.r.t. every input that takes one (by name)."""
    names = [k for k, x in inputs.items() if x.requires_grad]
    out = fn(grouped(inputs, case))
    g = torch.randn_like(out) if g is None else g
    grads = torch.autograd.grad((out * g).sum(), [inputs[k] for k in names], allow_unused=True)
    return out, g, dict(zip(names, grads, strict=True))


CASES = {
    "bias+cache, 2 heads": Case(),
    "no bias, no cache": Case(bias=False, cache=False),
    "bias, no cache, 3 of 4 rows": Case(cache=False, rows=3),
    "cache, no bias, one decoding row": Case(bias=False, rows=1, g=1),
    "one-block window": Case(one_block=True, items=1),
    "no gradient to the previous block": Case(prev_grad=False),
    "per-item codebook (cache_key_grad)": Case(per_item_codes=True),
    "block of 5, 1 head": Case(block=5, rows=5, g=1, m=5),
    "block of 32: skipped tiles": Case(block=32, rows=32, g=1, items=2, n=1, m=20, s=20),
    "sliding window (no cache)": Case(cache=False, block=32, rows=32, g=1, items=2, n=1, m=8, span=8),
    "values in 3 chunks": Case(d_v=40),  # the interpreter's chunks are 16 wide: the GAU's path on a GPU
    "values in 3 chunks, per-item codebook": Case(d_v=40, per_item_codes=True, prev_grad=False),
    # no bias and blocks of whole tiles: the tiles every row sees take unmasked loops (the kernels' WHOLE), the rest
    # masked ones; queries from position 8 of their block, so the diagonal tiles fall inside the row blocks
    "whole tiles, 2 heads, rows from 8": Case(bias=False, block=32, rows=24, g=2, items=3, n=1, s=20),
    "whole tiles, sliding window": Case(
        bias=False, cache=False, block=32, rows=32, g=1, items=3, n=1, span=20
    ),
    "whole tiles, values in 3 chunks": Case(bias=False, block=32, rows=32, g=1, items=2, n=1, s=20, d_v=40),
    # every key and code tile, value chunk and head whole (d_k 16 unpadded): the forward and dq load without masks
    # (the kernels' EVEN), with and without the bias
    "even tiles, bias": Case(block=32, rows=32, g=2, items=2, n=1, d_k=16, d_v=32, s=32, m=8),
    "even tiles, whole tiles, rows from 8": Case(
        bias=False, block=32, rows=24, g=2, items=3, n=1, d_k=16, d_v=32, s=32
    ),  # fmt: skip
    # and through tensor descriptors (the kernels' TMA, as the cases above without the bias): values in dq's one chunk,
    # a per-item codebook over two sequences (the code rows' offsets)
    "even tiles, whole tiles, per-item codebook": Case(
        bias=False, block=32, rows=32, g=1, items=2, n=2, d_k=16, d_v=16, s=32, per_item_codes=True
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_triton_equals_plain_and_naive_fp32(case: Case, device: str) -> None:
    torch.manual_seed(0)
    inputs = make_inputs(case, device=device)
    fused = lambda x: fused_window_cache_attention(x, prev_grad=case.prev_grad)
    plain = lambda x: window_cache_attention(x, prev_grad=case.prev_grad)
    out, g, grads = outputs_and_grads(fused, inputs, case)
    for name, fn in (("plain", plain), ("naive", naive_window_cache_attention)):
        want_out, _, want = outputs_and_grads(fn, inputs, case, g)
        assert rel_err(out, want_out) <= TOL, name
        for key, got in grads.items():
            if name == "naive" and not case.prev_grad and key in ("kb", "vb"):
                continue  # the naive reference has no stop-gradient on the previous block
            assert rel_err(got, want[key]) <= TOL, (name, key)
            assert want[key].abs().sum() > 0, key  # every input really receives a gradient
    if not case.prev_grad:  # the previous block of item i is key block i: only the last block gets none
        assert grads["kb"][:, 0].abs().sum() == 0 and grads["kb"][:, 1:].abs().sum() > 0


SHORT_WINDOW_CASES = (
    "bias+cache, 2 heads",
    "no gradient to the previous block",
    "whole tiles, 2 heads, rows from 8",
    "even tiles, whole tiles, per-item codebook",  # through tensor descriptors
)


@pytest.mark.parametrize("name", SHORT_WINDOW_CASES)
def test_triton_takes_the_key_blocks_without_item_0s_masked_previous_block(name: str) -> None:
    """With ``prev_masked``, ``kb`` and ``vb`` may leave out item 0's previous block (the layer then joins no zero
    block in front): the output and every gradient equal, bit for bit, those of the call given that block (random
    here: the kernels never read it), and the blocks given take the same gradients."""
    case = CASES[name]
    torch.manual_seed(0)
    inputs = make_inputs(case)
    short = inputs | {k: inputs[k][:, 1:].detach().requires_grad_() for k in ("kb", "vb")}
    fused = lambda x: fused_window_cache_attention(x, prev_grad=case.prev_grad)
    out, g, grads = outputs_and_grads(fused, inputs, case)
    got_out, _, got = outputs_and_grads(fused, short, case, g)
    assert torch.equal(got_out, out)
    for key, want in grads.items():
        assert torch.equal(got[key], want[:, 1:] if key in ("kb", "vb") else want), key
        assert got[key].abs().sum() > 0, key


def test_triton_refuses_key_blocks_that_do_not_fit_the_window_in_one_line() -> None:
    case = Case(
        cache=False
    )  # 3 items of a two-block window: 4 blocks, or 3 with item 0's masked block left out
    inputs = grouped(make_inputs(case), case)
    two = inputs._replace(kb=inputs.kb[:, 2:], vb=inputs.vb[:, 2:])
    with pytest.raises(
        ValueError, match=r"2 key and 2 value blocks for 3 items of a 2-block window; allowed: 4 or 3$"
    ):
        fused_window_cache_attention(two)
    three = inputs._replace(kb=inputs.kb[:, 1:], vb=inputs.vb[:, 1:], prev_masked=False)
    with pytest.raises(
        ValueError, match=r"allowed: 4 \(without prev_masked, item 0's previous block must be given\)"
    ):
        fused_window_cache_attention(three)
    uneven = inputs._replace(vb=inputs.vb[:, 1:])
    with pytest.raises(ValueError, match="4 key and 3 value blocks"):
        fused_window_cache_attention(uneven)


# the tiles the GPU runs (config.tiles' bf16 configurations), on shapes that cross their edges: 128-row and 128-key
# tiles, 96 rows of 128 and a 96-key block (not whole tiles), values in chunks of 128 (dq's dO·vᵀ by 32)
GPU_TILE_CASES = {
    "no bias, whole tiles, 2 heads": Case(
        bias=False, block=128, rows=128, g=2, items=2, n=1, d_k=64, d_v=64, s=64
    ),
    "bias, 96 of 128 rows": Case(block=128, rows=96, g=1, items=2, n=1, d_k=64, d_v=64, s=64, m=100),
    "no bias, d 128, values in two chunks": Case(
        bias=False, block=128, rows=128, g=1, items=2, n=1, d_k=128, d_v=160, s=64
    ),
    "bias, block of 96, per-item codebook": Case(
        block=96, rows=96, g=1, items=2, n=1, d_k=128, d_v=128, s=40, m=50, per_item_codes=True
    ),
    "no bias, sliding window": Case(
        bias=False, cache=False, block=128, rows=128, g=1, items=3, n=1, d_k=64, d_v=64, span=70
    ),
    # blocks and a codebook of whole 128-key tiles: the forward steps 128 keys, dq 64; two row blocks, so the second
    # sees its block's first tile whole
    "no bias, 128-key tiles, two row blocks": Case(
        bias=False, block=256, rows=256, g=1, items=2, n=1, d_k=64, d_v=64, s=128
    ),
}


@pytest.mark.parametrize("case", GPU_TILE_CASES.values(), ids=GPU_TILE_CASES.keys())
def test_the_gpu_tiles_equal_plain_and_naive_under_the_interpreter(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other tests run the interpreter's 16-wide tiles; these run the tiles a GPU runs (fp32 under the
    interpreter: its dots are exact), so a fault that only their sizes reach (whole-tile ranges, 128-key programs,
    partial row blocks) shows here without a GPU."""
    shipped = config.tiles

    def gpu_tiles(kernel: str, d_k: int, d_v: int, interpret: bool = False, fp32: bool = False,
                  bias: bool = False, block: int = 0, codes: int = 0, strided: bool = False) -> Tiles:  # fmt: skip
        return shipped(kernel, d_k, d_v, bias=bias, block=block, codes=codes, strided=strided)

    monkeypatch.setattr(op, "tiles", gpu_tiles)
    torch.manual_seed(0)
    inputs = make_inputs(case)
    out, g, grads = outputs_and_grads(fused_window_cache_attention, inputs, case)
    for name, fn in (("plain", window_cache_attention), ("naive", naive_window_cache_attention)):
        want_out, _, want = outputs_and_grads(fn, inputs, case, g)
        assert rel_err(out, want_out) <= TOL, name
        for key, got in grads.items():
            assert rel_err(got, want[key]) <= TOL, (name, key)


DESCRIPTOR_CASES = ("even tiles, whole tiles, rows from 8", "even tiles, whole tiles, per-item codebook")


def count_descriptor_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tiles the interpreted kernels load through tensor descriptors from here on (one counter)."""
    from triton.runtime import interpreter

    builder, loads = interpreter.interpreter_builder, [0]
    real = builder.create_descriptor_load

    def spy(*args: object, **kwargs: object) -> object:
        loads[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(builder, "create_descriptor_load", spy)
    return loads


@pytest.mark.parametrize("name", DESCRIPTOR_CASES)
def test_whole_tiles_load_through_tensor_descriptors_equal_to_their_pointers_bit_for_bit(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where every tile is whole and there is no XL bias, the forward and ``dq`` load their key, value, code and mean
    tiles through tensor descriptors (the GPU's bulk copies): the flat rows of each, a key tile's rows at a time. The
    output and every gradient equal, bit for bit, those of the same kernels loading by pointers."""
    case = CASES[name]
    torch.manual_seed(0)
    inputs = make_inputs(case)
    made, loads = count_descriptors(monkeypatch), count_descriptor_loads(monkeypatch)
    with torch.no_grad():
        fused_window_cache_attention(grouped(inputs, case))
    forward_loads = loads[0]
    out, g, grads = outputs_and_grads(fused_window_cache_attention, inputs, case)
    assert 0 < forward_loads < loads[0] - forward_loads  # the forward loads through them, and so does dq
    rows = lambda x: (x.numel() // x.shape[-1], x.shape[-1])  # noqa: E731
    flat = [rows(inputs[k]) for k in ("kb", "vb", "codebook", "mu")]
    assert [shape for shape, _ in made] == flat * 3  # the forward's (twice), then dq's
    assert all(block[0] == tiles("forward", 16, 16, interpret=True).bn for _, block in made)
    shipped = config.tiles
    no_descriptors = lambda *a, **k: dataclasses.replace(shipped(*a, **k), tma=False)  # noqa: E731
    monkeypatch.setattr(op, "tiles", no_descriptors)
    made.clear()
    want_out, _, want = outputs_and_grads(fused_window_cache_attention, inputs, case, g)
    assert made == []
    assert torch.equal(out, want_out)
    for key, got in grads.items():
        assert torch.equal(got, want[key]), key


def test_a_tensor_that_a_descriptor_cannot_start_at_loads_by_pointers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key tensor whose first element is not 16-byte aligned (a view into its storage) makes no descriptors (their
    base must be): the kernels load by pointers, and equal the plain kernel."""
    case = CASES[DESCRIPTOR_CASES[0]]
    torch.manual_seed(0)
    inputs = make_inputs(case)
    shifted = torch.empty(inputs["kb"].numel() + 1)[1:].view_as(inputs["kb"])
    inputs["kb"] = shifted.copy_(inputs["kb"].detach()).requires_grad_()
    made = count_descriptors(monkeypatch)
    out, g, grads = outputs_and_grads(fused_window_cache_attention, inputs, case)
    assert made == []
    want_out, _, want = outputs_and_grads(window_cache_attention, inputs, case, g)
    assert rel_err(out, want_out) <= TOL
    for key, got in grads.items():
        assert rel_err(got, want[key]) <= TOL, key


def spy_on_taken(monkeypatch: pytest.MonkeyPatch, *more: tuple[object, str]) -> list[bool]:
    """Whether the ops read each of their inputs as given (not a copy), in order, from here on: their queries, keys and
    values (``op.taken_queries``, ``op.taken``) and ``more`` such functions ``(module, name)``."""
    taken: list[bool] = []
    for module, name in ((op, "taken_queries"), (op, "taken"), *more):
        real = getattr(module, name)

        def spy(*args: object, real=real, name=name) -> object:  # noqa: ANN001
            got = real(*args)
            outs = got if name == "taken" else (got[0] if isinstance(got, tuple) else got,)
            taken.extend(out is given for out, given in zip(outs, args, strict=False))
            return got

        monkeypatch.setattr(module, name, spy)
    return taken


def layout(x: torch.Tensor) -> list[int]:
    """``x``'s strides where they matter: of its dims longer than one."""
    return [step for step, size in zip(x.stride(), x.shape, strict=True) if size > 1]


def heads_interleaved(x: torch.Tensor, heads: int, split: int | None = None) -> torch.Tensor:
    """Flat ``x (N, I, R, d)`` (``N = B·heads``) as the ops take a model's projections of ``heads`` key heads: ``(B,
    heads, I, R, d)`` (or, ``split``, ``(B, heads, I, split, R / split, d)``: the ``G`` query heads of each row block)
    seen from memory laid out time-major with the heads innermost (``(B, I, R, heads, d)``), the same values: a leaf."""
    b, items, rows, d = x.shape[0] // heads, *x.shape[1:]
    shape = (b, heads, items, rows, d) if split is None else (b, heads, items, split, rows // split, d)
    order = (0, 2, 3, 1, 4) if split is None else (0, 2, 4, 1, 3, 5)  # (B, I, [Lq,] heads, [G,] d) in memory
    memory = x.detach().reshape(shape).permute(order).contiguous()
    return memory.permute([order.index(i) for i in range(len(order))]).requires_grad_(x.requires_grad)


STRIDED_CASES = {
    "cache, 2 heads a key head": (Case(bias=False, n=4), 2, True),
    "bias+cache (every row copied contiguous)": (Case(n=4), 2, True),
    "per-item codebook, values in 3 chunks": (Case(bias=False, n=4, per_item_codes=True, d_v=40), 4, True),
    # values laid out otherwise than the keys: copied into the keys' layout (the kernels read both through its rows)
    "values contiguous, keys not": (Case(bias=False, n=4), 2, False),
    # whole even tiles: the forward and dq load keys and values through descriptors whose rows span the heads
    "even tiles through descriptors": (
        Case(bias=False, block=32, rows=32, g=1, items=2, n=2, d_k=16, d_v=16, s=32),
        2,
        True,
    ),  # fmt: skip
}


@pytest.mark.parametrize(
    ("case", "heads", "values_interleaved"), STRIDED_CASES.values(), ids=STRIDED_CASES.keys()
)
def test_the_ops_read_heads_interleaved_inputs_through_their_strides(
    case: Case, heads: int, values_interleaved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queries, keys and values of several key heads as a model's projections lay them out (heads innermost: ``B``
    and the heads do not merge into one sequence axis) go to the ops as ``(B, H_kv, ...)`` views and are read where
    they lie: no copy (values in another layout than the keys' are copied into theirs; with the XL bias every row goes
    contiguous before the ops, one sequence axis). The output and every gradient equal, bit for bit, those of the same
    values given flat and contiguous; the gradients come in their inputs' layout, the output in the queries', and a
    seed gradient of another layout (contiguous) is taken."""
    torch.manual_seed(0)
    flat = make_inputs(case)
    loads = count_descriptor_loads(monkeypatch)
    out, g, grads = outputs_and_grads(fused_window_cache_attention, flat, case)
    flat_loads = loads[0]
    taken, sequences = spy_on_taken(monkeypatch), []
    real_op = op.window_cache_forward
    monkeypatch.setattr(
        op, "window_cache_forward", lambda q, *a: sequences.append(q.shape[1]) or real_op(q, *a)
    )
    values = heads_interleaved(flat["vb"], heads)
    values = values if values_interleaved else flat["vb"].detach().view(values.shape).requires_grad_()
    strided = dict(flat) | {
        "q": heads_interleaved(flat["q"], heads, case.g), "kb": heads_interleaved(flat["kb"], heads), "vb": values
    }  # fmt: skip
    inputs = grouped(strided, case)
    got = fused_window_cache_attention(inputs, prev_grad=case.prev_grad)
    assert sequences == [1 if case.bias else heads]  # with the bias, one sequence axis
    assert got.shape == strided["q"].shape[:-1] + (case.d_v,)
    # the queries' layout, positions apart by every head (contiguous with the bias, the queries copied)
    assert got.stride()[-2] == (1 if case.bias else heads * case.g) * case.d_v
    names = [k for k, x in strided.items() if x.requires_grad]
    seed = g.reshape(got.shape).contiguous()  # not the output's layout
    new = dict(zip(names, torch.autograd.grad((got * seed).sum(), [strided[k] for k in names]), strict=True))
    assert torch.equal(got.reshape(out.shape), out)
    for key, want in grads.items():
        if key in ("q", "kb", "vb" if values_interleaved else "q") and not case.bias:
            assert layout(new[key]) == layout(strided[key]), key
        assert torch.equal(new[key].reshape(want.shape), want), key
    assert taken == [True, True, values_interleaved] * 2  # the forward's and the backward's
    assert loads[0] == 2 * flat_loads  # through descriptors wherever the flat call loads through them
    assert (flat_loads > 0) == (case.d_k == 16)  # the even case's


@pytest.mark.parametrize(("heads", "strided"), [(2, True), (1, False)])
def test_the_op_sizes_its_tiles_for_keys_whose_rows_lie_apart(
    heads: int, strided: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys of several heads laid out heads innermost (their rows apart) take the tiles for such rows
    (:func:`~tvq_exp.attention.vq.fused.config.tiles`'s ``strided``: fewer rows a step of the keys' gradient); one
    head's contiguous keys take the others, in every kernel."""
    case = Case(bias=False, n=2)
    torch.manual_seed(0)
    flat = make_inputs(case)
    asked: list[bool] = []
    real = op.tiles
    monkeypatch.setattr(op, "tiles", lambda *a: asked.append(a[-1]) or real(*a))
    strided_inputs = dict(flat) | {k: heads_interleaved(flat[k], heads) for k in ("kb", "vb")}
    strided_inputs["q"] = heads_interleaved(flat["q"], heads, case.g)
    outputs_and_grads(fused_window_cache_attention, strided_inputs, case)
    assert asked and set(asked) == {strided}


@pytest.mark.parametrize("device", DEVICES)
def test_triton_bf16_operands_track_fp32(device: str) -> None:
    """bf16 queries, keys, values and bias (fp32 cache means, as the layer's; the op rounds them to bf16, as the
    plain kernel's products do): within 1e-2 of fp32."""
    case = Case(block=32, rows=32, m=20, s=20)
    torch.manual_seed(1)
    inputs = make_inputs(case, device=device)
    low = {
        k: v.detach().bfloat16() if k in ("q", "kb", "vb", "bias_q", "rel") else v for k, v in inputs.items()
    }
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = fused_window_cache_attention(grouped(low | {"vb": low["vb"].requires_grad_()}, case))
    # the means go to the kernels, and are kept for the backward, in the values' dtype
    assert [t.dtype for t in kept if t.shape == low["mu"].shape] == [torch.bfloat16]
    ref = naive_window_cache_attention(
        grouped({k: v.float() if v.is_floating_point() else v for k, v in low.items()}, case)
    )
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) <= 1e-2


# ----------------------------------------------------------------------------- through the layer


def make_pair(block_len: int = 4, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``VQAttention`` with ``kernel=plain`` and ``kernel=triton``, sharing every weight (fp32, XL bias)."""
    opts = dict(d_k=6, d_v=5, heads=2, codebook_size=5, block_len=block_len, window_bias=True) | kw
    plain = build("vq", **opts).float()
    torch.nn.init.normal_(plain.bias.u)
    torch.nn.init.normal_(plain.bias.v)
    fused = build("vq", kernel="triton", **opts).float()
    fused.load_state_dict(plain.state_dict())
    return plain.eval(), fused.eval()


def qkv(t: int, h_kv: int = 2, b: int = 2):  # noqa: ANN201
    mk = lambda h, d: torch.randn(b, h, t, d, requires_grad=True)
    return mk(2, 6), mk(h_kv, 6), mk(h_kv, 5)


LAYER_CASES = {
    "13 positions (padded), grouped heads": dict(kv_heads=1),
    "no gradient through the cache": dict(grad_through_cache=False),
    "cache_key_grad": dict(cache_key_grad=True, codebook_size=3),
    "cache_keys=mean": dict(cache_keys="mean", codebook_size=3),
    "cache_code_grad": dict(cache_code_grad=True, codebook_size=3, codebook={"update": "gradient"}),
    "no cache": dict(use_cache=False, window_len=2),
}


@pytest.mark.parametrize("opts", LAYER_CASES.values(), ids=LAYER_CASES.keys())
def test_layer_triton_equals_plain(opts: dict) -> None:
    torch.manual_seed(2)
    plain, fused = make_pair(**opts)
    q, k, v = qkv(13, h_kv=opts.get("kv_heads", 2))
    want = plain(q, k, v)[0]
    got = fused(q, k, v)[0]
    assert fused.last_kernel == "triton" and plain.last_kernel == "plain"
    assert rel_err(got, want) <= TOL
    g = torch.randn_like(want)
    params = [p for p in plain.parameters() if p.requires_grad]
    wants = torch.autograd.grad((want * g).sum(), (q, k, v, *params), allow_unused=True)
    gots = torch.autograd.grad((got * g).sum(), (q, k, v, *[p for p in fused.parameters() if p.requires_grad]),
                               allow_unused=True)  # fmt: skip
    for got_g, want_g in zip(gots, wants, strict=True):
        assert (got_g is None) == (want_g is None)
        if want_g is not None and want_g.abs().sum() > 0:
            assert rel_err(got_g, want_g) <= TOL


@pytest.mark.parametrize(("kernel", "joins"), [("triton", 0), ("plain", 2)])
def test_one_key_heads_window_reaches_the_fused_kernels_without_a_copy(kernel: str, joins: int) -> None:
    """A single key head's keys and values (the GAU, MQA), as a model's projections give them, are already the
    kernels' layout. The fused kernels read item 0's window without a block in front, so the layer hands them views;
    the others take a masked zero block joined in front: one copy of the window's keys and one of its values."""
    from collections import Counter

    from tests.helpers.ops import OpLog

    b, t, d, block = 2, 32, 8, 8
    layer = build("vq", d_k=d, d_v=d, heads=1, codebook_size=4, block_len=block, kernel=kernel)
    q, k, v = (torch.randn(b, t, 1, d, requires_grad=True).transpose(1, 2) for _ in range(3))
    with OpLog() as log:
        layer(q, k, v)
    assert layer.last_kernel == kernel
    window = b * (t // block + 1) * block * d
    copies = Counter(
        op.numel for op in log.named("aten.clone", "aten.constant_pad_nd", "aten.cat", "aten.copy_")
    )
    assert copies[window] == joins and copies[b * t * d] == 0


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("use_cache", [True, False])
def test_several_heads_reach_the_fused_kernels_and_their_gradients_leave_them_without_a_copy(
    use_cache: bool, kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several heads' queries, keys and values as a model's projections give them (``(B, T, H, d)`` seen as ``(B, H,
    T, d)``: ``B`` and the heads do not merge into one sequence axis) reach the fused kernels (window and means) as
    they are, read through their strides: no copy of them in the forward, none inside the ops, and no copy of their
    gradients in the backward, which come in the leaves' own layout (as flash's). The output and every gradient equal
    ``kernel=plain``'s."""
    from collections import Counter

    from tests.helpers.ops import OpLog
    from tvq_exp.attention.vq.fused import prefix

    b, t, h, d, block = 2, 32, 2, 8, 8
    opts = dict(
        d_k=d, d_v=d, heads=h, kv_heads=kv_heads, codebook_size=4, block_len=block, use_cache=use_cache
    )
    layer, plain = build("vq", kernel="triton", **opts), build("vq", kernel="plain", **opts)
    plain.load_state_dict(layer.state_dict())
    leaves = [torch.randn(b, t, heads, d, requires_grad=True) for heads in (h, kv_heads, kv_heads)]
    taken = spy_on_taken(monkeypatch, (prefix, "_in_place"))
    with OpLog() as log:
        out = layer(*(x.transpose(1, 2) for x in leaves))[0]
        g = torch.randn(b, t, h, d).transpose(1, 2)
        grads = torch.autograd.grad((out * g).sum(), leaves)
    assert layer.last_kernel == "triton"
    assert taken and all(taken), taken  # the ops read their inputs as given
    full = b * kv_heads * t * d
    names = ("aten.clone", "aten.constant_pad_nd", "aten.cat", "aten.copy_", "aten._to_copy")
    assert Counter((o.name, o.numel) for o in log.named(*names) if o.numel >= full) == {}
    for x, grad in (
        (leaves[0], grads[0]),
        (leaves[2], grads[2]),
    ):  # the keys' pass the quantiser's own layout
        assert layout(grad) == layout(x)  # the leaves' layout, as the kernels wrote them
    want = plain(*(x.transpose(1, 2) for x in leaves))[0]
    assert rel_err(out, want) <= TOL
    for got, want_g in zip(grads, torch.autograd.grad((want * g).sum(), leaves), strict=True):
        assert rel_err(got, want_g) <= TOL


def test_layer_triton_streams_a_continued_segment_as_one_call() -> None:
    _, fused = make_pair()
    q, k, v = (x.detach() for x in qkv(15))
    whole = fused(q, k, v)[0]
    pieces, state, start = [], None, 0
    for end in (6, 7, 15):  # a cut inside a block, a one-position step, the rest
        out, state, _ = fused(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        pieces.append(out)
        start = end
    assert rel_err(torch.cat(pieces, 2), whole) <= TOL


def test_layer_triton_is_causal() -> None:
    """Changing the inputs after position ``t`` leaves outputs ``0..t`` as they were, and their gradient
    reaches no later input."""
    _, fused = make_pair(block_len=3)
    q, k, v = qkv(11)
    out = fused(q, k, v)[0]
    for t in (4, 8):
        later = [x.detach().clone() for x in (q, k, v)]
        for x in later:
            x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :])
        changed = fused(*later)[0]
        assert torch.equal(changed[:, :, : t + 1], out[:, :, : t + 1])
        assert not torch.equal(changed[:, :, t + 1 :], out[:, :, t + 1 :])
        grads = torch.autograd.grad(out[:, :, : t + 1].sum(), (q, k, v), retain_graph=True)
        assert all(gr[:, :, t + 1 :].abs().sum() == 0 for gr in grads)
        assert all(gr[:, :, : t + 1].abs().sum() > 0 for gr in grads)


# ----------------------------------------------------------------------------- where it cannot run


def test_triton_is_refused_in_one_line_without_the_interpreter_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    inputs = grouped(make_inputs(Case(bias=False, cache=False)), Case(bias=False, cache=False))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1") as err:
        fused_window_cache_attention(inputs)
    assert "\n" not in str(err.value)
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match=r"kernel='triton'.*TRITON_INTERPRET=1.*plain, flex, auto"):
            build("vq", d_k=4, d_v=4, heads=1, codebook_size=4, block_len=4, kernel="triton")


def test_triton_refuses_float64_in_one_line() -> None:
    case = Case(bias=False, cache=False)
    with pytest.raises(ValueError, match="fp32, bf16 or fp16 operands, not torch.float64"):
        fused_window_cache_attention(grouped(make_inputs(case, torch.float64), case))


@pytest.mark.parametrize("bias", [True, False])
def test_triton_refuses_an_index_whose_bias_distances_differ_from_the_bias(bias: bool) -> None:
    """The fused kernels take the bias columns from the distance logits and the index's ``max_distance`` alike:
    an index for another bias window is refused in one line, not read with the wrong columns."""
    case = Case(bias=bias, cache=False)
    inputs = grouped(make_inputs(case), case)
    other = inputs.index._replace(max_distance=None if bias else 2)
    with pytest.raises(ValueError, match="does not fit the bias's distances"):
        fused_window_cache_attention(inputs._replace(index=other))


# ----------------------------------------------------------------------------- where kernel=auto takes it


@pytest.mark.parametrize(
    ("device", "queries", "d_v", "dtype", "kernel", "taken"),
    [
        ("cuda", 128, 128, torch.bfloat16, "auto", True),
        ("cuda", 128, 256, torch.bfloat16, "auto", True),  # two forward chunks of 128
        ("cuda", 128, 256, torch.float32, "auto", True),
        ("cuda", 128, 257, torch.bfloat16, "auto", False),
        ("cuda", 128, 1536, torch.bfloat16, "auto", False),  # the GAU: the plain kernel's GEMMs
        ("cuda", 127, 128, torch.bfloat16, "auto", False),  # a decoding-sized call
        ("cpu", 128, 128, torch.bfloat16, "auto", False),
        ("cuda", 128, 1536, torch.bfloat16, "triton", True),  # named: always
        ("cuda", 128, 128, torch.bfloat16, "plain", False),
    ],
)
def test_auto_takes_triton_on_cuda_only_for_values_of_two_forward_chunks(
    device: str, queries: int, d_v: int, dtype: torch.dtype, kernel: str, taken: bool
) -> None:
    """``kernel=auto``'s choice per call (:func:`wants_triton`), on fake CUDA tensors (no GPU needed): the fused
    kernels recompute the scores per value chunk, so values wider than two forward chunks stay plain."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, queries, 128, device=device, dtype=dtype)
        assert wants_triton(kernel, q, d_v) is taken


@pytest.mark.parametrize(
    ("d_v", "grad", "kernel", "chosen"),
    [
        (128, True, "auto", "triton"),
        (1536, True, "auto", "plain"),  # the GAU's values: the plain kernel, not compiled flex
        (1536, False, "auto", "plain"),  # inference too
        (1536, True, "flex", "flex"),  # named: always
        (1536, True, "triton", "triton"),
    ],
)
def test_on_cuda_auto_takes_the_fused_kernels_by_the_values_width_else_plain(
    d_v: int, grad: bool, kernel: str, chosen: str
) -> None:
    """The layer's choice per call (:meth:`window_kernel`) on fake CUDA tensors: the fused kernels where the values
    fit two forward chunks, else the plain kernel; never compiled flex unless named."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = build("vq", d_k=128, d_v=d_v, heads=1, codebook_size=16, block_len=128, kernel=kernel)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.set_grad_enabled(grad):
        q, kw = (torch.empty(2, 1, 256, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        vw = torch.empty(2, 1, 256, d_v, device="cuda", dtype=torch.bfloat16)
        assert layer.window_kernel(q, kw, vw, per_item=False) == chosen


def test_the_layer_runs_the_kernel_it_chose_with_its_values_width(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    spy = lambda kernel, q, d_v: asked.append((kernel, q.shape[-1], d_v))  # noqa: E731
    monkeypatch.setattr(vq_layer, "wants_triton", spy)
    layer = build("vq", d_k=4, d_v=12, heads=2, codebook_size=4, block_len=4, kernel="auto")
    layer(*(torch.randn(1, 2, 9, d) for d in (4, 4, 12)))
    assert asked and set(asked) == {("auto", 4, 12)}
    assert layer.last_kernel == "plain"


@pytest.mark.slow
def test_every_shipped_configuration_compiles_for_sm90a_without_spills() -> None:
    """``make kernel-report`` as a test (its own process, as Triton's mode is per process): every configuration
    :mod:`tvq_exp.attention.vq.fused.config` ships, compiled for an H100 with Triton's ptxas (no GPU needed), spills
    no register (bf16) and fits the shared memory, and its products use Hopper's wgmma (the kernels with none, the
    means' walks, their code rows, the backward's row term and the quantiser's pass over its keys, load, add and store
    only)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tvq_exp.attention.vq.fused.report"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ") and "bf16" in line]
    without_products = {"means forward", "means backward", "means rows", "row term", "quantiser statistics",
                        "quantiser error_grad", "search pieces", "quantiser metrics"}  # fmt: skip
    with_products = [cells for cells in rows if cells[1].strip() not in without_products]
    assert len(with_products) > len(without_products)
    assert all(cells[13].strip() == "yes" for cells in with_products)  # the wgmma column


@pytest.mark.slow
def test_every_shipped_configuration_compiles_without_spills_under_the_lent_gpus_triton() -> None:
    """``make kernel-report-device``: the same report under the Triton the lent GPUs run (3.6, installed beside the
    venv), whose compiler builds the kernels there and allocates registers otherwise (32 rows a step of the window
    keys' one-pass gradient spilled under it, not under 3.8). Skipped, saying why, where that Triton cannot be
    installed (offline, without its wheel)."""
    plan = subprocess.run(["make", "-n", "--no-print-directory", "kernel-report-device"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    version = re.search(r"PYTHONPATH=\.triton/([\w.]+) ", plan)[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(["make", "--no-print-directory", "kernel-report-device"], cwd=REPO, capture_output=True,
                          text=True, env=env)  # fmt: skip
    if done.returncode and not (REPO / ".triton" / version / "triton").is_dir():
        pytest.skip(f"Triton {version} could not be installed: {done.stderr.strip().splitlines()[-1:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"Triton {version}, sm_90a" in done.stdout


# the layouts and products of a compiled kernel's TTGIR, as Triton 3.8 prints them for sm_90a (trimmed)
TTGIR_LAYOUTS = """
#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 2], instrShape = [16, 64, 16]}>
#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], instrShape = [16, 32, 16]}>
"""
PRODUCT = (
    "      %s_{i} = ttng.warp_group_dot %q, %k, %acc {{inputPrecision = 0 : i32, isAsync = true}} : "
    "tensor<{m}x128xbf16, #ttg.dot_op<{{opIdx = 0, parent = {layout}, kWidth = 2}}>> * "
    "!ttg.memdesc<128x{n}xbf16, #shared, #smem> -> tensor<{m}x{n}xf32, {layout}> loc(#loc1)\n"
)


@pytest.mark.parametrize(
    ("products", "expected"),
    [
        ([(128, 64, "#mma1")], 1),  # 8 warps along 128 rows: each warpgroup its own 64
        ([(64, 128, "#mma")], 1),  # one warpgroup per 64 columns
        ([(64, 64, "#mma1"), (64, 128, "#mma")], 2),  # 64 rows on 8 warps: both warpgroups compute them
        ([(128, 128, "#mma")], 1),  # 64 rows a warpgroup, wrapped twice: more rows, not repeated ones
        ([(64, 32, "#mma")], 4),  # 2 × 64 columns of layout for 32
        ([(64, 16, "#mma1")], 4),  # 128 rows × 32 columns of layout for 64 × 16
        ([], 1),  # no Hopper product (an mma.sync or a CPU kernel): nothing repeated
    ],
)
def test_the_compile_report_counts_products_every_warpgroup_repeats(
    products: list[tuple[int, int, str]], expected: int
) -> None:
    """:func:`repeats` reads a product's tile against its layout's reach: 16 rows per warp along the rows (a warpgroup
    64) and the instruction's columns per warp along the columns; a tile smaller than that reach is computed whole by
    every warpgroup it leaves out."""
    body = "".join(PRODUCT.format(i=i, m=m, n=n, layout=lay) for i, (m, n, lay) in enumerate(products))
    assert repeats(TTGIR_LAYOUTS + body) == expected


@pytest.mark.parametrize("heads", SHIPPED)
@pytest.mark.parametrize("fp32", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_shipped_tiles_give_every_warpgroup_64_rows_of_each_product(
    heads: tuple[int, int], fp32: bool, bias: bool
) -> None:
    """The rule the compile report's ``repeats`` column checks, on the tiles alone: a kernel's products have a row per
    query row (``bm``: the forward, ``dq``) or per key or code (``bn``: their gradients), and each warpgroup (four
    warps) takes 64 of them: fewer rows than the warps reach make both warpgroups compute the same scores."""
    for kernel in KERNEL_NAMES:
        t = tiles(kernel, *heads, fp32=fp32, bias=bias)
        rows = t.bm if kernel in ("forward", "dq") else t.bn
        assert rows == 64 * t.num_warps // 4, (kernel, heads, t)


@pytest.mark.parametrize(
    ("d_k", "fp32", "bias", "block", "codes", "forward", "dq"),
    [
        (128, False, False, 512, 512, 128, 64),  # the paper's and the GPU check's S = L = 512
        (128, False, False, 512, 0, 128, 64),  # no cache
        (64, False, False, 256, 128, 128, 64),
        (96, False, False, 128, 128, 128, 64),  # keys padded to 128
        (128, False, False, 320, 512, 64, 64),  # blocks of 2.5 forward tiles: it would compute masked keys
        (128, False, False, 512, 320, 64, 64),  # a codebook of 2.5 forward tiles
        (128, False, False, 96, 512, 64, 32),  # blocks of 1.5 dq tiles
        (128, False, False, 0, 512, 64, 32),  # the block not known
        (128, True, False, 512, 512, 64, 32),  # fp32 operands: wide tiles would overflow shared memory
        (256, False, False, 512, 512, 64, 32),  # wider keys
        (128, False, True, 512, 512, 32, 32),  # the XL bias: its gather and its gradient's scatter
    ],
)
def test_the_forward_and_dq_step_wide_key_tiles_where_the_blocks_and_the_codebook_hold_them(
    d_k: int, fp32: bool, bias: bool, block: int, codes: int, forward: int, dq: int
) -> None:
    """The forward steps 128 keys and ``dq`` 64 (fewer instructions per key, ``dO·vᵀ`` under the shared memory's
    rate: docs/benchmarks.md) only where every tile of the window and the cache is whole, without the XL bias, for
    bf16 keys at most 128 wide; else their narrow tiles."""
    got = {
        k: tiles(k, d_k, 128, fp32=fp32, bias=bias, block=block, codes=codes).bn for k in ("forward", "dq")
    }
    assert got == {"forward": forward, "dq": dq}


@pytest.mark.parametrize(
    ("kernel", "d_k", "d_v", "fp32", "bias", "strided", "rows"),
    [
        ("code", 128, 128, False, False, False, 64),  # 64 rows, no spills under Triton 3.6 or 3.8
        ("code", 128, 1536, False, False, False, 64),  # in value chunks, and the codes apart
        (
            "code",
            128,
            128,
            True,
            False,
            False,
            32,
        ),  # fp32: 64 rows would take 257 KB of shared memory, over 227
        ("code", 64, 64, False, False, True, 64),
        ("window_key", 128, 128, False, False, False, 32),  # keys and values in one pass: 64 rows spill
        ("window_key", 128, 128, False, True, False, 32),
        # the check's four heads innermost: their rows' addresses spill 44 bytes at 32 under Triton 3.6
        ("window_key", 128, 128, False, False, True, 16),
        (
            "window_key",
            128,
            1536,
            False,
            False,
            True,
            64,
        ),  # the values' chunks and the keys apart: 64 rows fit
        ("window_key", 64, 64, False, False, True, 64),  # keys 64 wide: 64 rows fit
    ],
)
def test_the_gradients_of_keys_and_codes_step_the_most_rows_that_compile_without_spills(
    kernel: str, d_k: int, d_v: int, fp32: bool, bias: bool, strided: bool, rows: int
) -> None:
    """The keys' and codes' gradients step as many query rows as compile for sm_90a without spills under both
    Tritons (``make kernel-report``, ``make kernel-report-device``, in the check's layout of four heads and in one
    head's) and within a block's shared memory: more rows a step, fewer instructions per row, and products that read
    less shared memory (docs/benchmarks.md)."""
    assert tiles(kernel, d_k, d_v, fp32=fp32, bias=bias, block=512, codes=512, strided=strided).bm == rows


@pytest.mark.parametrize(
    ("kernel", "d_k", "d_v", "fp32", "bias", "block", "interpret", "tma"),
    [
        ("forward", 128, 128, False, False, 512, False, True),  # the wide key tiles
        ("dq", 128, 128, False, False, 512, False, True),
        ("forward", 64, 64, False, False, 512, False, True),
        ("dq", 64, 64, False, False, 512, False, False),  # dq's 64-wide keys: more instructions through them
        ("forward", 128, 1536, False, False, 512, False, True),  # in value chunks
        ("dq", 128, 1536, False, False, 512, False, False),  # dq's chunked tiles are narrow
        ("forward", 128, 128, False, False, 320, False, False),  # narrow tiles (blocks of 2.5 wide ones)
        ("dq", 128, 128, True, False, 512, False, False),  # fp32: narrow tiles
        ("forward", 128, 128, False, True, 512, False, False),  # the XL bias
        ("dq", 128, 128, False, True, 512, False, False),
        ("window_key", 128, 128, False, False, 512, False, False),
        ("code", 128, 128, False, False, 512, False, False),
        ("forward", 128, 128, False, False, 0, True, True),  # the interpreter: every forward and dq tile
        ("dq", 64, 64, False, True, 0, True, True),
        ("window_key", 128, 128, False, False, 0, True, False),
    ],
)
def test_the_forward_and_dq_load_through_tensor_descriptors_with_wide_key_tiles_and_no_bias(
    kernel: str, d_k: int, d_v: int, fp32: bool, bias: bool, block: int, interpret: bool, tma: bool
) -> None:
    """On the GPU, the forward's and dq's wide key tiles, never taken with the XL bias, and dq's for keys wider than 64
    (where the compiled loops take fewer instructions and registers through descriptors: docs/benchmarks.md); under the
    interpreter every forward and dq tile, so that the tests load both ways (the op takes descriptors only where every
    tile is whole)."""
    t = tiles(kernel, d_k, d_v, interpret, fp32, bias, block, block)
    assert t.tma is tma


@pytest.mark.parametrize("cache", [False, True])
def test_the_op_sizes_its_key_tiles_by_the_calls_block_and_codebook(
    cache: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kernel's tiles are asked with the call's keys per block and codebook size (0 without a cache), so the
    wide key tiles are taken only where they are whole."""
    shipped, seen = config.tiles, {}

    def spy(kernel: str, d_k: int, d_v: int, interpret: bool = False, fp32: bool = False, bias: bool = False,
            block: int = 0, codes: int = 0, strided: bool = False) -> Tiles:  # fmt: skip
        seen[kernel] = (block, codes)
        return shipped(kernel, d_k, d_v, interpret, fp32, bias, block, codes, strided)

    monkeypatch.setattr(op, "tiles", spy)
    case = Case(bias=False, cache=cache, block=8, rows=8, items=2, n=1, s=12)
    outputs_and_grads(fused_window_cache_attention, make_inputs(case), case)
    assert seen == {kernel: (8, 12 if cache else 0) for kernel in KERNEL_NAMES if cache or kernel != "code"}
