"""A validation at the last training step, so every run ends with a metric on the console and in
``finished.json``, whatever ``trainer.val_check_interval`` is."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class FinalValidation(Callback):
    """At the end of the batch that reaches ``trainer.max_steps``, asks Lightning to stop, which makes its
    training loop run the validation loop on that batch (once: a step that is also a regular validation step
    is validated once). Runs without validation data (``limit_val_batches=0``) are left alone."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if 0 < trainer.max_steps <= trainer.global_step and trainer.limit_val_batches != 0:
            trainer.should_stop = True


__all__ = ["FinalValidation"]
