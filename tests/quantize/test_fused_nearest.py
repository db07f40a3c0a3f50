"""The fused nearest-code search (``tvq_exp.quantize.fused_nearest``), on CPU under Triton's interpreter and compiled
on CUDA where there is one: the same codes as the plain search (``kmeans.nearest_code``) at ragged shapes, the
first of equal codes on a tie (torch.argmin's rule) within a tile and across tiles, and on CUDA the op that
``nearest_code`` takes there, kept whole by ``torch.compile``."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.quantize.fused_nearest import BM, BS, fused_nearest_code
from tvq_exp.quantize.kmeans import nearest_code

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def plain(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """The plain search (on the CPU: ``nearest_code`` takes the fused op on CUDA)."""
    return nearest_code(x.cpu(), codebook.cpu())


@pytest.mark.parametrize(
    ("heads", "rows", "codes", "dim"),
    [(2, BM + 7, BS + 5, 6), (3, 2 * BM, 3 * BS, 16), (1, 5, 512, 128)],  # ragged rows, codes and dims
)
def test_equals_the_plain_search(heads: int, rows: int, codes: int, dim: int) -> None:
    gen = torch.Generator().manual_seed(rows + codes)
    x, codebook = torch.randn(heads, rows, dim, generator=gen), torch.randn(heads, codes, dim, generator=gen)
    got = fused_nearest_code(x, codebook)
    assert got.dtype == torch.long and got.shape == (heads, rows)
    assert torch.equal(got, plain(x, codebook))


def test_a_tie_takes_the_first_equal_code_within_a_tile_and_across_tiles() -> None:
    gen = torch.Generator().manual_seed(0)
    codebook = torch.randn(1, 2 * BS + 3, 8, generator=gen)
    codebook[0, 5] = codebook[0, 2]  # equal codes in one tile
    codebook[0, BS + 1] = codebook[0, 9]  # and in two tiles
    codebook[0, 2 * BS + 2] = codebook[0, BS + 4]  # the later tile first
    x = codebook[:, [5, 2, BS + 1, 9, 2 * BS + 2, BS + 4, 0]]
    want = torch.tensor([[2, 2, 9, 9, BS + 4, BS + 4, 0]])
    assert torch.equal(plain(x, codebook), want)
    assert torch.equal(fused_nearest_code(x, codebook), want)


def test_no_rows_give_no_codes() -> None:
    assert fused_nearest_code(torch.zeros(2, 0, 4), torch.randn(2, 3, 4)).shape == (2, 0)


@needs_cuda
def test_on_cuda_the_search_is_the_fused_op_equal_to_the_plain_one_and_compiles_whole() -> None:
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 10_000, 128, generator=gen)).cuda()
    codebook = torch.randn(4, 512, 128, generator=gen).cuda()
    got = nearest_code(x, codebook)
    agree = (got.cpu() == plain(x, codebook)).float().mean().item()
    assert agree > 0.9999  # tf32x3 against fp32: a flip only between two codes at equal distance to rounding
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(nearest_code, fullgraph=True)(x, codebook)
    assert torch.equal(compiled, got) and dict(counters["graph_break"]) == {}
