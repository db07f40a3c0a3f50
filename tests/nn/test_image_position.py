"""Row/column/channel embeddings follow the raster order with interleaved channels."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.nn import ImagePositionEmbedding, raster_coordinates


def test_raster_coordinates_interleave_channels() -> None:
    row, col, ch = raster_coordinates(torch.arange(2 * 3 * 3), (2, 3, 3))
    assert ch[:6].tolist() == [0, 1, 2, 0, 1, 2]
    assert col[:9].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert row.tolist() == [0] * 9 + [1] * 9


def test_embedding_is_sum_of_parts_and_refuses_out_of_range() -> None:
    emb = ImagePositionEmbedding(8, 2, 3, 3)
    t = torch.tensor([0, 4, 17])
    expect = (
        emb.row(torch.tensor([0, 0, 1]))
        + emb.col(torch.tensor([0, 1, 2]))
        + emb.channel(torch.tensor([0, 1, 2]))
    )
    assert torch.equal(emb(t), expect)
    with pytest.raises(ValueError, match="outside an image of 2x3x3"):
        emb(torch.tensor([18]))
