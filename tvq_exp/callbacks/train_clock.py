"""One training clock for every run: ``time/train_s``, the seconds since training started.

A wall-clock axis read from event times starts at each run's first logged event, which differs by backend
(VQ logs codebook scalars at step 0, dense first logs at ``log_every_n_steps``). :class:`TrainClock` logs the
time since ``on_train_start`` at every logging step and every validation, so the analysis
(:func:`tvq_exp.tools.analysis.runs.train_seconds`) puts each scalar at the training time of its step. A
continued run's clock goes on from the time stored in its checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

TAG = "time/train_s"


class TrainClock(Callback):
    """Logs :data:`TAG` (seconds of training, validation included, since ``on_train_start``) to every logger at
    each step where the trainer logs (``log_every_n_steps``) and after each validation."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._before = 0.0  # seconds trained before this launch (a continued run)
        self._logged = -1  # the last step logged (accumulated batches share a step)

    def elapsed(self) -> float:
        """Seconds of training so far (0 before training starts)."""
        return self._before + (time.perf_counter() - self._start if self._start is not None else 0.0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self._log(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._start is not None:
            self._log(trainer)

    def _log(self, trainer: L.Trainer) -> None:
        if trainer.global_step == self._logged:
            return
        self._logged = trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics({TAG: self.elapsed()}, step=trainer.global_step)

    def state_dict(self) -> dict[str, float]:
        return {"train_s": self.elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._before = float(state_dict.get("train_s", 0.0))


__all__ = ["TAG", "TrainClock"]
