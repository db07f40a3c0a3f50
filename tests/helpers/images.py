"""Checking a written plot by its pixels, not its file size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import image


def drawn_fraction(path: Path, min_shape: tuple[int, int] = (200, 300)) -> float:
    """Decode the PNG at ``path``; assert it is at least ``min_shape`` (rows, columns) and holds something in
    colour (a curve, not only black axes on white); the fraction of pixels that are not the background."""
    pixels = image.imread(path)[..., :3]
    assert pixels.shape[0] >= min_shape[0] and pixels.shape[1] >= min_shape[1], pixels.shape
    background = np.median(pixels.reshape(-1, 3), axis=0)
    drawn = np.abs(pixels - background).sum(-1) > 0.1
    coloured = (pixels.max(-1) - pixels.min(-1)) > 0.2  # matplotlib's curves; axes and text are grey
    assert coloured.sum() > 50, f"{path}: no coloured curve"
    return float(drawn.mean())


__all__ = ["drawn_fraction"]
