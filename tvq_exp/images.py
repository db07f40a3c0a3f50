"""Images from sub-pixel token models: sampling, prompt completion and PNG grids.

Token images hold pixel levels ``0..levels-1`` in ``(N, H, W, C)`` layout (``C`` = 1 or 3); the BOS token
is ``levels`` (see :mod:`tvq_exp.data.images`). Sampling runs the decoder token by token from its
streaming state (:func:`tvq_exp.sampling.generate`), so every sub-pixel costs the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid

from tvq_exp.data.images import flatten_image, unflatten_tokens
from tvq_exp.model import Decoder
from tvq_exp.sampling import generate


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
    """Write an RGB grid ``(GH, GW, 3)`` uint8 as a PNG (parent folders created) -> the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid.cpu().numpy()).save(path)
    return path


def _bos_prompt(n: int, levels: int, device: torch.device) -> Tensor:
    """``(n, 1)`` BOS tokens."""
    return torch.full((n, 1), levels, dtype=torch.long, device=device)


def sample_images(
    model: Decoder,
    n: int,
    image_shape: Sequence[int],
    levels: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw ``n`` images from the BOS prompt -> ``(n, H, W, C)`` int64 levels ``0..levels-1``.

    ``image_shape`` is ``(H, W, C)``; the BOS token is never sampled. The model is left in eval mode.
    """
    device = next(model.parameters()).device
    tokens = generate(
        model,
        _bos_prompt(n, levels, device),
        math.prod(image_shape),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
        vocab_limit=levels,
    )
    return unflatten_tokens(tokens, image_shape)


def complete_images(
    model: Decoder,
    images: Tensor,
    levels: int,
    given_rows: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Keep the top ``given_rows`` (default ``H // 2``) rows of ``images (N, H, W, C)`` (levels) and sample
    the rest -> ``(N, H, W, C)`` int64, equal to ``images`` in the given rows."""
    n, height, width, channels = images.shape
    given_rows = height // 2 if given_rows is None else given_rows
    if not 0 <= given_rows < height:
        raise ValueError(f"given_rows must be in [0, {height}), got {given_rows}")
    device = next(model.parameters()).device
    known = torch.stack([flatten_image(image) for image in images]).to(device)[
        :, : given_rows * width * channels
    ]
    prompt = torch.cat([_bos_prompt(n, levels, device), known], dim=1)
    rest = generate(
        model,
        prompt,
        (height - given_rows) * width * channels,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
        vocab_limit=levels,
    )
    return unflatten_tokens(torch.cat([known, rest], dim=1), (height, width, channels))


def completion_grid(originals: Tensor, completed: Tensor, levels: int, scale: int = 1) -> Tensor:
    """Originals in the top row, their completions below -> RGB grid ``(GH, GW, 3)`` uint8.

    ``originals`` and ``completed`` are ``(N, H, W, C)`` levels.
    """
    both = torch.cat([originals.to(completed.device), completed])
    return image_grid(levels_to_uint8(both, levels), nrow=len(originals), scale=scale)


def default_sample_path(ckpt_path: str | Path) -> Path:
    """``<ckpt dir>/samples-<ckpt name>.png``."""
    path = Path(ckpt_path)
    return path.with_name(f"samples-{path.stem}.png")


def sample_grid_png(
    model: Decoder,
    data_config: Mapping[str, Any],
    path: str | Path,
    num_samples: int = 16,
    nrow: int | None = None,
    scale: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Path:
    """Sample ``num_samples`` images of the run's data (``data_config``: ``image_shape``, ``vocab_size``)
    and write them as one PNG grid at ``path`` -> the path."""
    image_shape = [int(size) for size in data_config["image_shape"]]
    levels = int(data_config["vocab_size"]) - 1
    images = sample_images(model, num_samples, image_shape, levels, temperature, top_k, top_p, generator)
    return save_png(image_grid(levels_to_uint8(images, levels), nrow=nrow, scale=scale), path)


def sample_checkpoint_grid(model: Decoder, data_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> Path:
    """``sample.py`` for an image checkpoint: ``cfg.num_samples`` images as a PNG grid -> its path.

    Reads ``ckpt_path``, ``num_samples``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``device``
    (``auto`` = CUDA when available), ``image_nrow``, ``image_scale`` and ``output`` (the PNG path; default
    :func:`default_sample_path`) from ``cfg``.
    """
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if cfg["device"] == "auto" else cfg["device"])
    path = cfg.get("output") or default_sample_path(cfg["ckpt_path"])
    return sample_grid_png(
        model.to(device),
        data_config,
        path,
        num_samples=int(cfg["num_samples"]),
        nrow=cfg.get("image_nrow"),
        scale=int(cfg.get("image_scale") or 1),
        temperature=float(cfg["temperature"]),
        top_k=cfg.get("top_k"),
        top_p=cfg.get("top_p"),
        generator=torch.Generator(device=device).manual_seed(int(cfg["seed"])),
    )


__all__ = [
    "complete_images",
    "completion_grid",
    "default_sample_path",
    "grid_shape",
    "image_grid",
    "levels_to_uint8",
    "sample_checkpoint_grid",
    "sample_grid_png",
    "sample_images",
    "save_png",
]
