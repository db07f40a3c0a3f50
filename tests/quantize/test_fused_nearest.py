"""The fused nearest-code search (``tvq_exp.quantize.fused_nearest``), on CPU under Triton's interpreter and compiled
on CUDA where there is one: the same codes as the plain search (``kmeans.plain_nearest_code``) at ragged shapes, for fp32
and bf16 keys (strided ones too), the bf16 keys' three code pieces each deciding where only it tells two codes
apart, the first of equal codes on a tie (torch.argmin's rule) within a tile and across tiles, and on CUDA the op
that ``nearest_code`` takes there, kept whole by ``torch.compile``."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.measure.syncs import counting_syncs
from tvq_exp.quantize.fused_nearest import (
    TILES,
    bf16_rounded,
    code_pieces,
    fused_nearest_code,
    launch_pieces,
    search_codes,
)
from tvq_exp.quantize.kmeans import nearest_code, plain_nearest_code

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def plain(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """The plain search, on the CPU."""
    return plain_nearest_code(x.cpu(), codebook.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "row_tiles", "rows_more", "code_tiles", "codes_more", "dim"),
    [(2, 1, 7, 1, 5, 6), (3, 2, 0, 3, 0, 16), (1, 0, 5, 0, 512, 128)],  # ragged rows, codes and dims
)
def test_equals_the_plain_search(
    heads: int, row_tiles: int, rows_more: int, code_tiles: int, codes_more: int, dim: int, dtype: torch.dtype
) -> None:
    bm, bs = TILES[dtype][:2]
    rows, codes = row_tiles * bm + rows_more, code_tiles * bs + codes_more
    gen = torch.Generator().manual_seed(rows + codes)
    x = torch.randn(heads, rows, dim, generator=gen).to(dtype)
    codebook = torch.randn(heads, codes, dim, generator=gen)
    got = fused_nearest_code(x, codebook)
    assert got.dtype == torch.long and got.shape == (heads, rows)
    assert torch.equal(got, plain(x, codebook))
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # rows H apart, as (B, T, H, d) keys are
    assert torch.equal(fused_nearest_code(strided, codebook), got)


def test_the_bf16_pieces_of_a_code_sum_to_it_exactly_smallest_first() -> None:
    gen = torch.Generator().manual_seed(2)
    codes = torch.randn(2, 300, 32, generator=gen) * 2.0 ** torch.linspace(-80, 80, 32)  # exponents -80 to 80
    pieces = code_pieces(codes, torch.bfloat16)
    assert pieces.shape == (2, 3, 300, 32) and pieces.dtype == torch.bfloat16
    lo, mid, hi = pieces.float().unbind(1)
    assert torch.equal(lo + mid + hi, codes) and torch.equal(hi, codes.bfloat16().float())
    assert (mid.abs() <= hi.abs() * 2.0**-8).all() and (lo.abs() <= mid.abs() * 2.0**-8).all()
    assert torch.equal(code_pieces(codes, torch.float32), codes[:, None])


def test_the_bf16_pieces_compiled_are_the_pieces_eager() -> None:
    """Compiled, the search's pieces are made in the step's kernels. Inductor drops the rounding of a bf16 cast fused
    with its cast back: made by ``x.to(bf16).float()``, the second and third pieces came out zero (the compiled
    search then read codes rounded to bf16; the H200's CUDA test of the compiled search in bf16 failed on
    2026-11-30). The rounding by the bits is RNE, as the cast's, eager and compiled."""
    gen = torch.Generator().manual_seed(3)
    codes = torch.randn(2, 64, 32, generator=gen) * 2.0 ** torch.linspace(-60, 60, 32)
    ties = [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 0.0]  # halfway: to the even neighbour; and a zero
    codes[0, 0, :4] = torch.tensor(ties)
    torch._dynamo.reset()
    compiled = torch.compile(code_pieces, fullgraph=True)(codes, torch.bfloat16)
    assert torch.equal(compiled, code_pieces(codes, torch.bfloat16))
    assert torch.equal(compiled.float().sum(1), codes) and compiled[:, :2].abs().amax() > 0
    assert torch.equal(
        torch.compile(bf16_rounded, fullgraph=True)(codes), codes.bfloat16()
    )  # the bits' rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "codes", "dim"), [(2, 41, 20), (1, 3, 128), (3, 16, 7)])
def test_the_search_codes_of_one_launch_are_torchs(
    heads: int, codes: int, dim: int, dtype: torch.dtype
) -> None:
    """Eagerly the search's codes are one kernel (:func:`launch_pieces`): its pieces torch's (:func:`code_pieces`) bit
    for bit, the ties to even and zeros among them, across 120 binary orders of magnitude, at ragged rows and dims;
    its squared norms torch's up to the order of a sum. Compiled, torch's ops (in one graph) give the same."""
    gen = torch.Generator().manual_seed(heads * codes + dim)
    codebook = torch.randn(heads, codes, dim, generator=gen) * 2.0 ** torch.linspace(-60, 60, dim)
    codebook[0, 0, : min(dim, 4)] = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 0.0])[
        : min(dim, 4)
    ]
    c2, pieces = launch_pieces(codebook, dtype)
    want = code_pieces(-2 * codebook, dtype)
    assert pieces.dtype == dtype and torch.equal(pieces, want)
    assert c2.shape == (heads, codes) and torch.allclose(c2, (codebook * codebook).sum(-1), rtol=1e-6, atol=0)
    eager = search_codes(codebook, dtype)
    torch._dynamo.reset()
    compiled = torch.compile(search_codes, fullgraph=True)(codebook, dtype)
    assert torch.equal(eager[1], pieces) and torch.equal(compiled[1], pieces)
    assert torch.allclose(compiled[0], c2, rtol=1e-6, atol=0)


def test_eagerly_the_search_codes_are_one_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eagerly the search's codes for bf16 keys (the squared norms, the scaled codes' three pieces) are one kernel and
    two allocations, per layer and forward, where torch's ops took ten launches (the pieces rounded by casts; by the
    bits, as compiled, five launches a piece)."""
    import triton.runtime.interpreter as interpreter

    from tests.helpers.ops import OpLog

    launched: list[str] = []  # recorded, not run
    monkeypatch.setattr(
        interpreter.InterpretedFunction, "run", lambda self, *a, **k: launched.append(self.__name__)
    )
    codebook = torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(4))
    with OpLog() as log:
        search_codes(codebook, torch.bfloat16)
    assert [op.name for op in log.launches()] == ["aten.empty", "aten.empty"]
    assert launched == ["pieces_kernel"]


def test_bf16_keys_tell_apart_codes_that_differ_only_in_their_second_or_third_piece() -> None:
    """Head 0's codes ``(p, q)`` and ``(q, p)`` differ only in the second bf16 piece, head 1's only in the third:
    equal norms, so the key ``(1, 2)`` is nearer ``(q, p)`` by ``p - q``. A search that drops the piece sees two
    equal codes and takes the first."""
    pairs = [(1 + 2.0**-12, 1.0), (1 + 2.0**-9 + 2.0**-20, 1 + 2.0**-9)]
    codebook = torch.zeros(2, 2, 16)
    for head, (p, q) in enumerate(pairs):
        codebook[head, :, :2] = torch.tensor([[p, q], [q, p]])
    lo, mid, hi = code_pieces(codebook, torch.bfloat16).float().unbind(1)
    differ = [[bool((piece[head, 0] != piece[head, 1]).any()) for piece in (lo, mid, hi)] for head in (0, 1)]
    assert differ == [[False, True, False], [True, False, False]]
    x = torch.zeros(2, 3, 16)
    x[..., :2] = torch.tensor([1.0, 2.0])
    want = torch.ones(2, 3, dtype=torch.long)
    assert torch.equal(plain(x, codebook), want)
    assert torch.equal(fused_nearest_code(x.bfloat16(), codebook), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tie_takes_the_first_equal_code_within_a_tile_and_across_tiles(dtype: torch.dtype) -> None:
    bs = TILES[dtype][1]
    gen = torch.Generator().manual_seed(0)
    codebook = torch.randn(1, 2 * bs + 3, 8, generator=gen)
    codebook[0, 5] = codebook[0, 2]  # equal codes in one tile
    codebook[0, bs + 1] = codebook[0, 9]  # and in two tiles
    codebook[0, 2 * bs + 2] = codebook[0, bs + 4]  # the later tile first
    x = codebook[:, [5, 2, bs + 1, 9, 2 * bs + 2, bs + 4, 0]].to(dtype)
    want = torch.tensor([[2, 2, 9, 9, bs + 4, bs + 4, 0]])
    assert torch.equal(plain(x, codebook), want)
    assert torch.equal(fused_nearest_code(x, codebook), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_search_reads_nothing_of_the_device(dtype: torch.dtype) -> None:
    """Its wrapper (the pieces, the grid, the launch) never waits for the device: the quantiser runs it in every
    layer's step. Counted under the interpreter, whose copies of the operands are storage copies (not counted)."""
    gen = torch.Generator().manual_seed(3)
    x, codebook = torch.randn(2, 70, 16, generator=gen).to(dtype), torch.randn(2, 40, 16, generator=gen)
    with counting_syncs() as syncs:
        fused_nearest_code(x, codebook)
    assert syncs.events == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_searchs_op_launches_its_kernel_alone_and_compiled_makes_the_codebooks_pieces_outside_it(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The op ``nearest_code`` takes on a GPU (here its CPU kernel under the interpreter) is handed the codebook's
    squared norms and pieces: its body's one launch is the kernel (its output's allocation the one ATen op), where the
    pieces' 13 small ops (bf16 keys) each launched inside it; compiled, the op is one node whose inputs the graph
    makes, and the codes are the plain search's."""
    import importlib

    import triton.runtime.interpreter as interpreter

    from tests.helpers.ops import OpLog
    from tvq_exp.quantize.fused_nearest import search, search_codes

    kmeans = importlib.import_module("tvq_exp.quantize.kmeans")  # (the package's name kmeans is the function)
    gen = torch.Generator().manual_seed(3)
    x, codebook = torch.randn(2, 300, 16, generator=gen).to(dtype), torch.randn(2, 40, 16, generator=gen)
    c2, pieces = search_codes(codebook, dtype)
    launched: list[str] = []
    with (
        monkeypatch.context() as patch
    ):  # the launch recorded, not run: the interpreter's own copies not counted
        patch.setattr(
            interpreter.InterpretedFunction, "run", lambda self, *a, **k: launched.append(self.__name__)
        )
        with OpLog() as log:
            search(x, c2, pieces)
    assert [op.name for op in log.launches()] == ["aten.empty"] and launched == ["nearest_kernel"]
    got = search(x, c2, pieces)
    assert torch.equal(got, plain(x, codebook))
    monkeypatch.setattr(kmeans, "fused_search", lambda x: True)  # as on CUDA with Triton
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example: list) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(kmeans.nearest_code, backend=backend, fullgraph=True)(x, codebook)
    (graph,) = graphs
    (op,) = [n for n in graph.graph.nodes if str(n.target) == "tvq.nearest_code"]
    # the squared norms and the pieces made by the graph's own ops, handed to the op
    assert all(a.op in ("call_method", "call_function") for a in op.args[1:])
    assert torch.equal(compiled, got)


def test_no_rows_give_no_codes() -> None:
    assert fused_nearest_code(torch.zeros(2, 0, 4), torch.randn(2, 3, 4)).shape == (2, 0)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_search_is_the_fused_op_equal_to_the_plain_one_and_compiles_whole(
    dtype: torch.dtype,
) -> None:
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 10_000, 128, generator=gen).to(dtype).cuda()
    codebook = torch.randn(4, 512, 128, generator=gen).cuda()
    got = nearest_code(x, codebook)
    agree = (got.cpu() == plain(x, codebook)).float().mean().item()
    # fp32 sums in another order (tf32x3 for fp32 keys): a flip only between two codes at equal distance to rounding
    assert agree > 0.9999
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(nearest_code, fullgraph=True)(x, codebook)
    assert torch.equal(compiled, got) and dict(counters["graph_break"]) == {}


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_search_codes_of_one_launch_are_torchs(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    codebook = (torch.randn(4, 512, 128, generator=gen) * 2.0 ** torch.linspace(-40, 40, 128)).cuda()
    c2, pieces = launch_pieces(codebook, dtype)
    assert torch.equal(pieces, code_pieces(-2 * codebook, dtype))
    assert torch.allclose(c2, (codebook * codebook).sum(-1), rtol=1e-6, atol=0)
