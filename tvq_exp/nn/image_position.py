"""Absolute (row, column, channel) position embeddings for flattened images."""

from __future__ import annotations

from torch import Tensor, nn

from tvq_exp.options import PositiveInt, checked


class ImagePositionEmbedding(nn.Module):
    """Sum of learned row, column and channel embeddings for raster-order sub-pixel positions.

    Images are flattened row-major with channels interleaved (``t = (row·W + col)·C + channel``).
    Input position ``t`` holds the token before target ``t`` (a BOS token comes first), so the
    embedding at ``t`` describes the sub-pixel being predicted.

    Shapes: ``positions (T,)`` int -> ``(T, d_model)``.
    """

    @checked
    def __init__(
        self,
        d_model: PositiveInt,
        height: PositiveInt,
        width: PositiveInt,
        channels: PositiveInt,
    ) -> None:
        super().__init__()
        self.shape = (height, width, channels)
        self.row = nn.Embedding(height, d_model)
        self.col = nn.Embedding(width, d_model)
        self.channel = nn.Embedding(channels, d_model)
        for emb in (self.row, self.col, self.channel):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        h, w, c = self.shape
        if positions.numel() and int(positions.max()) >= h * w * c:
            raise ValueError(f"position {int(positions.max())} is outside an image of {h}x{w}x{c} sub-pixels")
        row, col, channel = raster_coordinates(positions, self.shape)
        return self.row(row) + self.col(col) + self.channel(channel)


def raster_coordinates(positions: Tensor, shape: tuple[int, int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """``(row, col, channel)`` of raster positions for an ``(H, W, C)`` image."""
    _, w, c = shape
    return positions // (w * c), positions // c % w, positions % c
