"""Drawing token images: pixel levels to uint8, grids of images (and of completions) as PNG files.

Token images hold pixel levels ``0..levels-1`` in ``(N, H, W, C)`` layout (``C`` = 1 or 3); see
:mod:`tvq_exp.data.images.tokens`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid

from tvq_exp.files import atomic_write


def levels_to_uint8(images: Tensor, levels: int) -> Tensor:
    """Pixel levels ``0..levels-1`` (any integer dtype, any shape) -> uint8 ``0..255`` (same shape)."""
    if levels < 2:
        raise ValueError(f"levels must be >= 2, got {levels}")
    if levels == 256:
        return images.to(torch.uint8)
    scaled = torch.round(images.double() * (255.0 / (levels - 1)))
    return scaled.clamp(0, 255).to(torch.uint8)


def grid_shape(
    n: int, height: int, width: int, nrow: int, padding: int = 2, scale: int = 1
) -> tuple[int, int]:
    """``(grid height, grid width)`` in pixels of :func:`image_grid` for ``n`` images of ``height x width``."""
    columns = min(nrow, n)
    rows = math.ceil(n / columns)
    return rows * (height * scale + padding) + padding, columns * (width * scale + padding) + padding


def image_grid(
    images: Tensor, nrow: int | None = None, padding: int = 2, scale: int = 1, pad_value: int = 0
) -> Tensor:
    """Tile uint8 ``images (N, H, W, C)`` (``C`` = 1 or 3) into one RGB grid ``(GH, GW, 3)`` uint8.

    Images fill rows of ``nrow`` (default ``ceil(sqrt(N))``) left to right, each enlarged ``scale`` times
    (nearest neighbour) and separated by ``padding`` pixels of ``pad_value``. Image ``i`` has its top-left
    corner at ``(padding + (i // nrow) * (H*scale + padding), padding + (i % nrow) * (W*scale + padding))``;
    :func:`grid_shape` gives ``(GH, GW)``.
    """
    if images.dim() != 4 or images.shape[-1] not in (1, 3) or images.dtype != torch.uint8:
        raise ValueError(
            f"expected uint8 images (N, H, W, C) with C in (1, 3), got {images.dtype} {tuple(images.shape)}"
        )
    if len(images) == 0:
        raise ValueError("cannot make a grid of zero images")
    nrow = nrow or math.ceil(math.sqrt(len(images)))
    planar = images.permute(0, 3, 1, 2)
    if scale > 1:
        planar = planar.repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3)
    grid = make_grid(planar.cpu(), nrow=nrow, padding=padding, pad_value=pad_value)
    return grid.permute(1, 2, 0).contiguous()


def save_png(grid: Tensor, path: str | Path) -> Path:
    """Write an RGB grid ``(GH, GW, 3)`` uint8 as a PNG (parent folders created; a contained write,
    :func:`tvq_exp.files.atomic_write`) -> the path."""
    path = Path(path)
    with atomic_write(path.name, path.parent) as handle:
        Image.fromarray(grid.cpu().numpy()).save(handle, format="PNG")
    return path


def completion_grid(originals: Tensor, completed: Tensor, levels: int, scale: int = 1) -> Tensor:
    """Originals in the top row, their completions below -> RGB grid ``(GH, GW, 3)`` uint8.

    ``originals`` and ``completed`` are ``(N, H, W, C)`` levels.
    """
    both = torch.cat([originals.to(completed.device), completed])
    return image_grid(levels_to_uint8(both, levels), nrow=len(originals), scale=scale)


__all__ = ["completion_grid", "grid_shape", "image_grid", "levels_to_uint8", "save_png"]
