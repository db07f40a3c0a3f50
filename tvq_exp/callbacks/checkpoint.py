"""Where checkpoints go and when: the best by the monitored metric, and ``last.ckpt`` after every validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from tvq_exp.options import OptionError

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"


class BestAndLastCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` follows every validation.

    Since Lightning 2.6 a monitored ``ModelCheckpoint`` writes ``last.ckpt`` only when it also writes a
    new top-k file, so once the monitored metric stops improving ``last.ckpt`` stays behind (a resume
    from it would repeat, or lose, every step since the best). Here ``last.ckpt`` is written at the
    end of every validation in any case; the top-k files follow the monitor as before, except that a
    non-finite value (a diverged run) never makes a "best" file.

    ``last.ckpt`` is always overwritten in place (atomically, the old one kept as ``last.prev.ckpt``), never
    versioned: Lightning's version counter would write ``last-v1.ckpt`` beside a ``last.ckpt`` that it did not
    write itself in this run, e.g. one saved by a preemption before the first validation, leaving ``last.ckpt``
    behind the run.
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.pop("enable_version_counter", False):
            raise OptionError(
                "callbacks.model_checkpoint.enable_version_counter",
                True,
                "must be false: last.ckpt is overwritten in place",
            )
        super().__init__(enable_version_counter=False, **kwargs)

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        value = monitor_candidates.get(self.monitor) if self.monitor else None
        if value is not None and not bool(torch.isfinite(torch.as_tensor(value))):
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)  # top-k (and last, when a top-k file was written)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            if not self._should_save_on_train_epoch_end(trainer):
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """The run's checkpoint folder: the ``ModelCheckpoint``'s ``dirpath``, else ``<root>/checkpoints``."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        return Path(callback.dirpath)
    return Path(trainer.default_root_dir) / CHECKPOINT_DIR


def save_last(trainer: L.Trainer) -> Path:
    """Write ``last.ckpt`` now (call at the end of a training batch) and return its path."""
    path = checkpoint_dir(trainer) / LAST
    trainer.save_checkpoint(path)
    return path
