"""Numerics guard: skip optimiser steps whose loss or gradients are not finite; stop after K in a row.

:class:`~tvq_exp.lit.LanguageModel` asks the guard (a callback found among the trainer's callbacks) after
the forward/backward of each optimiser step. On a bad step it runs neither the optimiser nor the codebook
update and drops the step's pending codebook statistics and carried stream state. The guard logs
``train/skipped_steps`` (total so far) and prints one line per skipped step. After ``max_bad_steps``
consecutive bad steps it saves ``last.ckpt`` (the weights are still the last good ones, since no bad step
updated them), stops training and records :attr:`NumericsGuard.failure`; ``cli.train`` then raises
:class:`NumericsError`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from tvq_exp.checkpointing import save_last


class NumericsError(RuntimeError):
    """Training stopped after too many consecutive steps with a non-finite loss or gradient."""


def all_finite(loss: Tensor | None, parameters: Iterable[nn.Parameter]) -> bool:
    """Whether ``loss`` (if any) and every gradient are finite."""
    values = [] if loss is None else [loss.detach().float().reshape(-1)]
    values += [p.grad.detach().float().reshape(-1) for p in parameters if p.grad is not None]
    return all(bool(torch.isfinite(v).all()) for v in values)


def find_guard(trainer: L.Trainer | None) -> NumericsGuard | None:
    """The trainer's :class:`NumericsGuard` callback, if it has one."""
    callbacks = trainer.callbacks if trainer is not None else []
    return next((c for c in callbacks if isinstance(c, NumericsGuard)), None)


class NumericsGuard(Callback):
    """Detect non-finite steps; see the module docstring.

    Args:
        max_bad_steps: consecutive bad steps after which training stops (>= 1).
    """

    def __init__(self, max_bad_steps: int = 10) -> None:
        if max_bad_steps < 1:
            raise ValueError(f"guard.max_bad_steps must be >= 1, got {max_bad_steps}")
        self.max_bad_steps = max_bad_steps
        self.skipped = 0
        self.consecutive = 0
        self.failure: str | None = None
        self._bad_this_step = False

    def step_is_finite(
        self, trainer: L.Trainer, loss: Tensor | None, parameters: Iterable[nn.Parameter]
    ) -> bool:
        """Check one optimiser step (before clipping); counts it when it is bad. Under DDP the step is bad
        on every rank when it is bad on any (all ranks skip together)."""
        finite = trainer.strategy.reduce_boolean_decision(all_finite(loss, parameters), all=True)
        self._bad_this_step = not finite
        if self._bad_this_step:
            self.skipped += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        return not self._bad_this_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._bad_this_step:
            return
        self._bad_this_step = False
        for logger in trainer.loggers:
            logger.log_metrics({"train/skipped_steps": float(self.skipped)}, step=trainer.global_step)
        self._say(
            trainer,
            f"step {trainer.global_step}: non-finite loss or gradient, step skipped "
            f"({self.consecutive} in a row, {self.skipped} in total)",
        )
        if self.consecutive >= self.max_bad_steps and self.failure is None:
            path = save_last(trainer)
            trainer.should_stop = True
            self.failure = (
                f"{self.consecutive} consecutive steps with a non-finite loss or gradient "
                f"(guard.max_bad_steps={self.max_bad_steps}) at step {trainer.global_step}; the last good "
                f"state is saved in {path}: lower module.lr, raise module.warmup_steps or check the data"
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.failure = None

    @staticmethod
    def _say(trainer: L.Trainer, message: str) -> None:
        if trainer.is_global_zero:
            print(message, file=sys.stdout, flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict["skipped"])
        self.consecutive = int(state_dict["consecutive"])


__all__ = ["NumericsError", "NumericsGuard", "all_finite", "find_guard"]
