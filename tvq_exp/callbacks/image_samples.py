"""Image samples during training: a grid of unconditional samples and of completed validation images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor

from tvq_exp.callbacks.numerics_guard import validation_diverged
from tvq_exp.data.images.module import ImageDataModule
from tvq_exp.data.images.render import completion_grid, image_grid, levels_to_uint8, save_png
from tvq_exp.data.images.tokens import unflatten_tokens
from tvq_exp.models.generation import complete_images, sample_images
from tvq_exp.models.sharding import is_sharded


class ImageSamples(Callback):
    """Every ``every_n_validations`` validations during ``fit`` (rank 0), sample images and log them.

    Writes ``<run dir>/<dirname>/step_XXXXXX.png`` (``num_samples`` samples from BOS) and
    ``step_XXXXXX_completed.png`` (top row: the first ``num_completions`` validation images; below: the
    same images with the top half given and the bottom half sampled), and adds both grids to TensorBoard
    as ``samples/unconditional`` and ``samples/completed``. Sampling uses a fixed ``seed`` so grids of
    successive validations are comparable.

    Active only when the trainer's data module is an :class:`~tvq_exp.data.images.module.ImageDataModule`
    (its ``image_shape`` and ``bos_id`` = pixel levels); otherwise (text, probes) it does nothing.
    """

    def __init__(
        self,
        every_n_validations: int = 1,
        num_samples: int = 16,
        num_completions: int = 8,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        scale: int = 4,
        seed: int = 0,
        dirname: str = "samples",
    ) -> None:
        if every_n_validations < 1 or num_samples < 1 or num_completions < 0 or scale < 1:
            raise ValueError(
                "ImageSamples needs every_n_validations >= 1, num_samples >= 1, num_completions >= 0, scale >= 1"
            )
        self.every_n_validations, self.num_samples, self.num_completions = (
            every_n_validations,
            num_samples,
            num_completions,
        )
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.scale, self.seed, self.dirname = scale, seed, dirname
        self._validations = 0
        self._prompts: Tensor | None = None

    @staticmethod
    def image_info(
        trainer: L.Trainer, pl_module: L.LightningModule
    ) -> tuple[tuple[int, int, int], int] | None:
        """``((H, W, C), levels)`` of the run's image data, or ``None`` when it is not image data."""
        datamodule = getattr(trainer, "datamodule", None)
        if not isinstance(datamodule, ImageDataModule):
            return None
        height, width, channels = (int(size) for size in datamodule.image_shape)
        return (height, width, channels), int(datamodule.bos_id)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if batch_idx == 0 and self._prompts is None and self.image_info(trainer, pl_module) is not None:
            self._prompts = batch["target"][: self.num_completions].detach().cpu()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or validation_diverged(trainer):
            return
        info = self.image_info(trainer, pl_module)
        if info is None:
            return
        self._validations += 1
        if self._validations % self.every_n_validations == 0:
            self.log_samples(trainer, pl_module, *info)

    def log_samples(
        self, trainer: L.Trainer, pl_module: L.LightningModule, shape: tuple[int, int, int], levels: int
    ) -> None:
        """Sample, write the PNGs and add the grids to every TensorBoard logger (rank 0; a sharded model
        samples on every rank, since each of its forwards gathers the parameters from all of them)."""
        model = pl_module.model
        if not (trainer.is_global_zero or is_sharded(model)):
            return
        was_training = model.training
        generator = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        options = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "generator": generator,
        }
        samples = sample_images(model, self.num_samples, shape, levels, **options)
        grids = {"unconditional": image_grid(levels_to_uint8(samples, levels), scale=self.scale)}
        if self._prompts is not None and len(self._prompts):
            originals = unflatten_tokens(self._prompts, shape)
            completed = complete_images(model, originals, levels, **options)
            grids["completed"] = completion_grid(originals, completed, levels, scale=self.scale)
        model.train(was_training)
        if trainer.is_global_zero:
            self.write(trainer, grids)

    def write(self, trainer: L.Trainer, grids: dict[str, Tensor]) -> None:
        """PNGs into ``<run dir>/<dirname>/`` and ``samples/<name>`` images into TensorBoard."""
        step = trainer.global_step
        folder = Path(trainer.default_root_dir) / self.dirname
        save_png(grids["unconditional"], folder / f"step_{step:06d}.png")
        if "completed" in grids:
            save_png(grids["completed"], folder / f"step_{step:06d}_completed.png")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for name, grid in grids.items():
                    logger.experiment.add_image(f"samples/{name}", grid.numpy(), step, dataformats="HWC")


__all__ = ["ImageSamples"]
