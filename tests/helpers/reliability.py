"""Test-only callbacks for the reliability tests (added with ``+callbacks.<name>._target_=...``).

They act on the real run: recording what happened, sending a real signal to the process, or making the
model's embeddings non-finite for chosen steps. None of them replaces the code under test.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn


def state_checksum(module: L.LightningModule) -> float:
    """Sum of every floating-point weight and buffer (codebook statistics included), in float64."""
    return float(sum(v.double().sum() for v in module.state_dict().values() if v.is_floating_point()))


class Recorder(Callback):
    """Appends ``{"step", "loss", "checksum", "finite"}`` (one JSON line) to ``path`` after every batch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        state = pl_module.state_dict().values()
        row = {
            "step": trainer.global_step,
            "loss": float(loss),
            "checksum": state_checksum(pl_module),
            "finite": all(bool(torch.isfinite(v).all()) for v in state if v.is_floating_point()),
        }
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The rows a :class:`Recorder` wrote."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


class SignalAt(Callback):
    """Sends ``signal_name`` to this process at the end of training step ``step``."""

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signal = signal.Signals[signal_name]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)


class TouchAt(Callback):
    """Creates the file ``path`` at the end of training step ``step`` (a subprocess tells the test it runs)."""

    def __init__(self, step: int, path: str) -> None:
        self.step = step
        self.path = Path(path)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.step and not self.path.exists():
            self.path.write_text(str(trainer.global_step))


class NanAt(Callback):
    """Makes the token embeddings NaN during the training batches of the given optimiser steps
    (``global_step`` before the batch); ``from_step`` makes every step from there on bad."""

    def __init__(self, steps: Sequence[int] = (), from_step: int | None = None) -> None:
        self.steps = set(steps)
        self.from_step = from_step
        self._handle: Any = None

    def _bad(self, step: int) -> bool:
        return step in self.steps or (self.from_step is not None and step >= self.from_step)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._bad(trainer.global_step):
            embedding = next(m for m in pl_module.modules() if isinstance(m, nn.Embedding))
            self._handle = embedding.register_forward_hook(_nan_output)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _nan_output(module: nn.Module, inputs: Any, output: Tensor) -> Tensor:
    return output * float("nan")


class StatePosition(Callback):
    """Appends ``{"step", "t"}`` after every training batch: the position ``t`` of the model's carried state
    (how many positions it has seen since its last reset)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        state = pl_module.train_state
        with self.path.open("a") as file:
            file.write(json.dumps({"step": trainer.global_step, "t": state[0].position}) + "\n")


class ScalarAtValidation(Callback):
    """Adds the scalar ``tag`` (value 1) straight to every TensorBoard logger's writer at the end of each
    validation, before the checkpoint of that step is written: a callback's direct write, as the sample and codebook
    callbacks make, which Lightning does not wait for as it does after ``self.log``."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_scalar(self.tag, 1.0, trainer.global_step)
