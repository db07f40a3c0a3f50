"""Numerics guard: report skipped non-finite steps and stop the run after ``max_bad_steps`` in a row.

The Lightning module (:class:`~tvq_exp.models.module.AutoregressiveLitModule`) decides on the device, after the
forward/backward of each optimiser step, whether the loss and every gradient are finite; a bad step changes
neither the weights, the optimiser's moments nor the codebooks. The module counts bad steps on the device
(``bad_steps``: in total, in a row) so that no step waits for the verdict; this callback reads the counts at
the logging steps (every ``log_every_n_steps``, the steps that read the device anyway) and at the end of
training: it logs ``train/skipped_steps`` (total so far) and prints one line when steps were skipped since it
last looked; once ``max_bad_steps`` or more steps in a row were bad it saves ``last.ckpt`` (the weights are still
the last good ones, since no bad step updated them), stops training and records :attr:`NumericsGuard.failure`;
the train command then raises :class:`NumericsError`. It stops at the first logging step past the limit.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tvq_exp.callbacks.checkpoint import save_last
from tvq_exp.console import say
from tvq_exp.models.module import logging_step
from tvq_exp.options import PositiveInt, checked


def validation_diverged(trainer: L.Trainer) -> bool:
    """Whether the latest validation loss is NaN or infinite (a diverged model: nothing to sample)."""
    loss = trainer.callback_metrics.get("val/loss")
    return loss is not None and not bool(torch.isfinite(torch.as_tensor(loss)))


class NumericsError(RuntimeError):
    """Training stopped after too many consecutive steps with a non-finite loss or gradient."""


class NumericsGuard(Callback):
    """Report skipped steps and stop after ``max_bad_steps`` (>= 1) consecutive ones; see the module docstring."""

    @checked
    def __init__(self, max_bad_steps: PositiveInt = 10) -> None:
        self.max_bad_steps = max_bad_steps
        self.failure: str | None = None
        self._reported = 0  # skipped steps when last reported

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.failure = None
        self._reported = pl_module.bad_step_counts()[0] if hasattr(pl_module, "bad_step_counts") else 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not hasattr(pl_module, "bad_step_counts") or not logging_step(trainer, trainer.global_step):
            return
        self.check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if hasattr(pl_module, "bad_step_counts"):
            self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the module's counts (one read of the device); report new skipped steps, stop past the limit."""
        skipped, consecutive = pl_module.bad_step_counts()
        before, self._reported = self._reported, skipped
        if skipped == before:
            return
        for logger in trainer.loggers:
            logger.log_metrics({"train/skipped_steps": float(skipped)}, step=trainer.global_step)
        say(
            f"step {trainer.global_step}: {skipped - before} step(s) with a non-finite loss or gradient skipped "
            f"since the last report ({consecutive} in a row, {skipped} in total)"
        )
        if consecutive >= self.max_bad_steps and self.failure is None and not trainer.should_stop:
            path = save_last(trainer)
            trainer.should_stop = True
            self.failure = (
                f"{consecutive} consecutive steps with a non-finite loss or gradient "
                f"(guard.max_bad_steps={self.max_bad_steps}) at step {trainer.global_step}; the last good "
                f"state is saved in {path}: lower module.lr, raise module.warmup_steps or check the data"
            )


__all__ = ["NumericsError", "NumericsGuard"]
