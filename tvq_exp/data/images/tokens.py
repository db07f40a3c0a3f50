"""Images as sub-pixel token sequences.

An image ``(H, W, C)`` is flattened row-major with channels interleaved (R, G, B of pixel (0, 0), then of
pixel (0, 1), ...) into ``T = H * W * C`` tokens. The model sees ``input = [BOS] + tokens[:-1]`` and
``target = tokens``, where ``BOS = levels`` (256 for 8-bit images, 17 for ``digits``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from tvq_exp.batch import Batch


def flatten_image(image: torch.Tensor) -> torch.Tensor:
    """``(H, W, C)`` image -> ``(H*W*C,)`` int64 tokens, row-major with channels interleaved."""
    if image.dim() != 3:
        raise ValueError(f"expected an (H, W, C) image, got shape {tuple(image.shape)}")
    return image.reshape(-1).long()


def unflatten_tokens(tokens: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``(..., H*W*C)`` tokens -> ``(..., H, W, C)`` (inverse of :func:`flatten_image`; dtype kept)."""
    height, width, channels = (int(size) for size in shape)
    if tokens.shape[-1] != height * width * channels:
        raise ValueError(f"{tokens.shape[-1]} tokens do not make an image of shape {tuple(shape)}")
    return tokens.reshape(*tokens.shape[:-1], height, width, channels)


@dataclass(frozen=True)
class ImageArray:
    """Images of one split, possibly spread over several arrays (e.g. memory-mapped files).

    ``parts`` hold ``(N_i, H, W, C)`` arrays, or ``(N_i, C, H, W)`` when ``planar`` (converted per item).
    """

    parts: tuple[np.ndarray, ...]
    planar: bool = False

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def __getitem__(self, index: int) -> np.ndarray:
        """Image ``index`` as a fresh contiguous ``(H, W, C)`` uint8 array."""
        for part in self.parts:
            if index < len(part):
                image = part[index]
                return np.array(image.transpose(1, 2, 0) if self.planar else image, order="C")
            index -= len(part)
        raise IndexError("image index out of range")

    def split_tail(self, count: int) -> tuple[ImageArray, ImageArray]:
        """``(all but the last count images, the last count images)`` as views."""
        head: list[np.ndarray] = []
        tail: list[np.ndarray] = []
        keep = len(self) - count
        if not 0 <= count < len(self):
            raise ValueError(f"cannot hold out {count} of {len(self)} images")
        for part in self.parts:
            cut = min(max(keep, 0), len(part))
            head.append(part[:cut])
            tail.append(part[cut:])
            keep -= len(part)
        return ImageArray(tuple(head), self.planar), ImageArray(tuple(tail), self.planar)


class ImageTokenDataset(Dataset[Batch]):
    """Map-style dataset of image token sequences.

    Item ``i``: ``{"input": (T,) int64 = [BOS] + tokens[:-1], "target": (T,) int64 = tokens,
    "reset": () bool = True}`` with ``T = H*W*C`` and ``BOS = levels``.
    """

    def __init__(self, images: ImageArray, levels: int) -> None:
        self.images = images
        self.levels = levels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Batch:
        tokens = flatten_image(torch.from_numpy(self.images[index]))
        bos = torch.full((1,), self.levels, dtype=torch.long)
        return {"input": torch.cat([bos, tokens[:-1]]), "target": tokens, "reset": torch.tensor(True)}
