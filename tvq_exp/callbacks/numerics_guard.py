"""Numerics guard: report skipped non-finite steps and stop the run after ``max_bad_steps`` in a row.

The Lightning module (:class:`~tvq_exp.models.module.AutoregressiveLitModule`) decides, after the
forward/backward of each optimiser step, whether the loss and every gradient are finite; a bad step runs
neither the optimiser nor the codebook update and drops the step's pending codebook statistics and
carried stream state. The module counts them (``skipped_steps``, ``consecutive_bad_steps``, and
``step_skipped`` for the step just done). This callback reads those counters: it logs
``train/skipped_steps`` (total so far) and prints one line per skipped step; after ``max_bad_steps``
consecutive bad steps it saves ``last.ckpt`` (the weights are still the last good ones, since no bad step
updated them), stops training and records :attr:`NumericsGuard.failure`; the train command then raises
:class:`NumericsError`.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tvq_exp.callbacks.checkpoint import save_last
from tvq_exp.console import say
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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.failure = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not getattr(pl_module, "step_skipped", False):
            return
        pl_module.step_skipped = False
        skipped, consecutive = pl_module.skipped_steps, pl_module.consecutive_bad_steps
        for logger in trainer.loggers:
            logger.log_metrics({"train/skipped_steps": float(skipped)}, step=trainer.global_step)
        say(
            f"step {trainer.global_step}: non-finite loss or gradient, step skipped "
            f"({consecutive} in a row, {skipped} in total)"
        )
        if consecutive >= self.max_bad_steps and self.failure is None:
            path = save_last(trainer)
            trainer.should_stop = True
            self.failure = (
                f"{consecutive} consecutive steps with a non-finite loss or gradient "
                f"(guard.max_bad_steps={self.max_bad_steps}) at step {trainer.global_step}; the last good "
                f"state is saved in {path}: lower module.lr, raise module.warmup_steps or check the data"
            )


__all__ = ["NumericsError", "NumericsGuard"]
