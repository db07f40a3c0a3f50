"""A quiet Rich progress bar."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from tvq_exp.models.module import logging_step


class QuietProgressBar(RichProgressBar):
    """Rich progress bar that disappears when done and hides Lightning's ``v_num``; a run bounded by
    ``max_steps`` (``max_epochs=-1``) reads ``Epoch 2``, not Lightning's ``Epoch 2/-2``."""

    def __init__(self, refresh_rate: int = 10, console_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=False, console_kwargs=console_kwargs)

    def _stop_progress(self) -> None:
        if self.progress is not None:
            self.progress.live.transient = True  # Rich erases a transient display when it stops
        super()._stop_progress()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's values without ``v_num``, and ``train/loss`` as of the latest logging step (read from the
        device only then: a value read at every step would make every step wait for the device)."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        loss = trainer.callback_metrics.get("train/loss")
        if trainer.training and loss is not None and logging_step(trainer, trainer.global_step):
            self._loss = float(loss)
        if getattr(self, "_loss", None) is not None:
            metrics["train/loss"] = self._loss
        return metrics

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            description += f"/{self.trainer.max_epochs - 1}"
        return f"{description:{len(self.validation_description)}}"
