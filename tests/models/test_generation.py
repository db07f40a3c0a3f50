"""Image grids, level scaling, and image sampling from the streaming state."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig
from PIL import Image
from torch import Tensor, nn

import tvq_exp  # noqa: F401 (registers the config resolvers)
from tests.helpers.paths import CONF
from tvq_exp.attention import build_attention
from tvq_exp.callbacks.image_samples import ImageSamples
from tvq_exp.data.images.render import completion_grid, grid_shape, image_grid, levels_to_uint8, save_png
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder, DecoderOutput, ModelState
from tvq_exp.models.generation import complete_images, sample_images
from tvq_exp.nn import ImagePositionEmbedding
from tvq_exp.run.validation import validate

SHAPE = (4, 3, 3)  # H, W, C: 36 sub-pixels
LEVELS = 5


def image_model(levels: int = LEVELS, shape: tuple[int, int, int] = SHAPE) -> Decoder:
    """A tiny float64 GAU-VQ image model with row/column/channel embeddings (block 8, 16 codes)."""
    attention = functools.partial(build_attention, name="vq", codebook_size=16, block_len=8)
    model = Decoder(
        vocab_size=levels + 1,
        d_model=32,
        n_layers=2,
        block=functools.partial(GAUBlock, d_k=16),
        attention=attention,
        pos_embedding=ImagePositionEmbedding(32, *shape),
    )
    return model.double().eval()


class LogitRecorder(nn.Module):
    """Wraps a decoder and keeps the last-position logits ``(B, V)`` of every call."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model
        self.seen: list[Tensor] = []

    def forward(self, tokens: Tensor, state: ModelState | None = None) -> DecoderOutput:
        out = self.model(tokens, state)
        self.seen.append(out.logits[:, -1].clone())
        return out


# ------------------------------------------------------------------------------------------- grids


def test_levels_to_uint8_spans_full_range() -> None:
    assert levels_to_uint8(torch.tensor([0, 8, 16]), 17).tolist() == [0, 128, 255]
    assert levels_to_uint8(torch.tensor([0, 7, 255]), 256).tolist() == [0, 7, 255]
    assert levels_to_uint8(torch.tensor([3]), 17).dtype == torch.uint8


def test_grid_places_each_pixel_at_its_position() -> None:
    n, height, width, nrow, padding, scale = 5, 2, 3, 3, 1, 2
    images = torch.arange(n * height * width * 3, dtype=torch.int64).remainder(251).to(torch.uint8)
    images = images.reshape(n, height, width, 3)
    grid = image_grid(images, nrow=nrow, padding=padding, scale=scale, pad_value=255)
    assert tuple(grid.shape) == (*grid_shape(n, height, width, nrow, padding, scale), 3) == (11, 22, 3)
    for i in range(n):
        top = padding + (i // nrow) * (height * scale + padding)
        left = padding + (i % nrow) * (width * scale + padding)
        for y in range(height * scale):
            for x in range(width * scale):
                assert torch.equal(grid[top + y, left + x], images[i, y // scale, x // scale])
    assert (grid[0] == 255).all() and (grid[:, 0] == 255).all()  # padding
    assert (grid[-1, -1] == 255).all() and (
        grid[padding + height * scale + padding :, -1] == 255
    ).all()  # empty cell


def test_grayscale_grid_is_replicated_to_rgb() -> None:
    images = torch.tensor([[[[10], [20]]], [[[30], [40]]]], dtype=torch.uint8)  # (2, 1, 2, 1)
    grid = image_grid(images, nrow=2, padding=0)
    assert tuple(grid.shape) == (1, 4, 3)
    assert grid[0, :, 0].tolist() == [10, 20, 30, 40] and torch.equal(grid[..., 0], grid[..., 2])


def test_image_grid_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8 images"):
        image_grid(torch.zeros(2, 4, 4, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="uint8 images"):
        image_grid(torch.zeros(2, 4, 4, 2, dtype=torch.uint8))


def test_png_round_trip(tmp_path: Path) -> None:
    images = torch.randint(0, 256, (7, 5, 6, 3), dtype=torch.uint8)
    grid = image_grid(images, nrow=4, scale=3)
    path = save_png(grid, tmp_path / "deep" / "grid.png")
    with Image.open(path) as png:
        assert png.mode == "RGB"
        assert png.size == (grid_shape(7, 5, 6, 4, 2, 3)[1], grid_shape(7, 5, 6, 4, 2, 3)[0])
        assert np.array_equal(np.asarray(png), grid.numpy())


def test_completion_grid_puts_originals_above_completions() -> None:
    originals = torch.zeros(3, 2, 2, 1, dtype=torch.long)
    completed = torch.full((3, 2, 2, 1), LEVELS - 1)
    grid = completion_grid(originals, completed, LEVELS)
    assert tuple(grid.shape) == (*grid_shape(6, 2, 2, 3), 3)
    assert grid[2, 2, 0] == 0 and grid[2 + 2 + 2, 2, 0] == 255


# ------------------------------------------------------------------------------------------- sampling


def test_token_by_token_sampling_matches_parallel_forward() -> None:
    """The logits seen while sampling (one token at a time from the state) equal the parallel forward's
    next-token logits for the same prefix, at every position of the image."""
    recorder = LogitRecorder(image_model())
    generator = torch.Generator().manual_seed(0)
    images = sample_images(recorder, 3, SHAPE, LEVELS, generator=generator)
    tokens = images.reshape(3, -1)
    assert len(recorder.seen) == tokens.shape[1] and int(tokens.max()) < LEVELS  # BOS is never drawn
    inputs = torch.cat([torch.full((3, 1), LEVELS), tokens[:, :-1]], dim=1)
    parallel = recorder.model(inputs).logits
    sequential = torch.stack(recorder.seen, dim=1)
    torch.testing.assert_close(sequential, parallel, rtol=1e-9, atol=1e-9)


def test_completion_keeps_the_given_rows_and_matches_parallel_forward() -> None:
    recorder = LogitRecorder(image_model())
    originals = torch.randint(0, LEVELS, (2, *SHAPE))
    completed = complete_images(recorder, originals, LEVELS, generator=torch.Generator().manual_seed(1))
    given = SHAPE[0] // 2
    assert completed.shape == originals.shape
    assert torch.equal(completed[:, :given], originals[:, :given])
    tokens = completed.reshape(2, -1)
    inputs = torch.cat([torch.full((2, 1), LEVELS), tokens[:, :-1]], dim=1)
    parallel = recorder.model(inputs).logits[:, given * SHAPE[1] * SHAPE[2] :]
    torch.testing.assert_close(torch.stack(recorder.seen, dim=1), parallel, rtol=1e-9, atol=1e-9)


def test_image_samples_callback_is_inactive_for_text() -> None:
    """The callback asks the trainer's data module (the data contract), not the module's kind."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        images = instantiate(compose("train", overrides=["data=digits"]).data)
        text = instantiate(compose("train", overrides=["data=shakespeare"]).data)
    module = SimpleNamespace()
    assert ImageSamples.image_info(SimpleNamespace(datamodule=images), module) == ((8, 8, 1), 17)
    assert ImageSamples.image_info(SimpleNamespace(datamodule=text), module) is None
    assert ImageSamples.image_info(SimpleNamespace(datamodule=None), module) is None


# ------------------------------------------------------------------------------------------- configs


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*overrides, "paths.output_dir=/tmp/unused"])


def test_pos_embedding_composes_onto_any_model() -> None:
    cfg = compose_train(["model=gau_dense", "data=cifar10", "+model/pos_embedding=image", "model.d_model=32"])
    validate(cfg)
    decoder = instantiate(cfg.model)
    assert isinstance(decoder.pos_embedding, ImagePositionEmbedding)
    assert decoder.pos_embedding.shape == (32, 32, 3) and decoder.pos_embedding.row.embedding_dim == 32


@pytest.mark.parametrize("experiment", ["quickstart", "cifar10_small", "imagenet64_paper"])
def test_image_experiments_compose_and_validate(experiment: str) -> None:
    cfg = compose_train([f"experiment={experiment}"])
    validate(cfg)
    assert cfg.data.kind == "image" and cfg.model.attention.name == "vq"
    assert cfg.model.pos_embedding.height == cfg.data.image_shape[0]
    assert cfg.callbacks.image_samples._target_ == "tvq_exp.callbacks.image_samples.ImageSamples"


def test_imagenet64_paper_settings() -> None:
    cfg = compose_train(["experiment=imagenet64_paper"])
    assert cfg.data.seq_len == 12288 and list(cfg.data.image_shape) == [64, 64, 3]
    assert (cfg.model.attention.block_len, cfg.model.attention.codebook_size) == (512, 512)
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.block.d_k) == (2048, 48, 128)
    assert cfg.data.batch_size * cfg.trainer.devices == cfg.global_batch_size == 128
    assert cfg.data.update_len == 1536 and cfg.model.logit_scale == 0.005  # 8 TBPTT updates per image
