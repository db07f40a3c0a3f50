"""A quiet Rich progress bar."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


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
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        if self.trainer.max_epochs is not None and self.trainer.max_epochs > 0:
            description += f"/{self.trainer.max_epochs - 1}"
        return f"{description:{len(self.validation_description)}}"
