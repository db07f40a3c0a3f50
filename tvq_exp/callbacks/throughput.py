"""Throughput to TensorBoard: tokens/s, step time, peak memory, TFLOP/s and model-FLOP utilisation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tvq_exp.measure.memory import peak_memory_mb
from tvq_exp.measure.peaks import device_peak_flops
from tvq_exp.measure.timing import matmul_peak_flops, sync
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.module import logging_step
from tvq_exp.models.sharding import DTYPES


def batch_tokens(batch: Any) -> int:
    """Tokens in one batch on this rank: ``batch["input"]`` is ``(B, T)``."""
    return int(batch["input"].numel()) if isinstance(batch, Mapping) else 0


def precision_dtype(precision: str | int | None) -> torch.dtype:
    """The matmul dtype of a Lightning ``precision``: ``bf16-*`` -> bf16, ``16-*`` -> fp16, ``64-*`` -> fp64,
    anything else fp32."""
    text = str(precision)
    prefixes = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
    return next((dtype for prefix, dtype in prefixes.items() if text.startswith(prefix)), torch.float32)


def training_dtype(trainer: L.Trainer) -> torch.dtype:
    """The dtype the model's matmuls run in: a sharding strategy's ``param_dtype`` (``trainer=fsdp`` computes in bf16
    under ``32-true`` precision, which names its fp32 master weights), else the precision's (:func:`precision_dtype`)."""
    param_dtype = getattr(trainer.strategy, "param_dtype", None)
    return DTYPES[param_dtype] if param_dtype in DTYPES else precision_dtype(trainer.precision)


class Throughput(Callback):
    """Logs ``throughput/{tokens_per_s, step_time_ms, peak_mem_mb, tflops_per_s, mfu, mfu_datasheet}`` at the
    logging steps (every ``log_every_n_steps`` optimiser steps), over the interval since the last. Tokens count
    every rank (``world_size`` times the local batch).

    Time: the wall clock of the interval, the device synchronised at its ends only (the logging steps, which
    read the device anyway), less the time spent in validation; data loading counts. No step in between waits
    for the device.

    ``tflops_per_s``: model FLOPs of all ranks per second, from the matmul FLOPs per token of a training step
    (:meth:`~tvq_exp.models.decoder.Decoder.flops` forward + backward, computed once from the first batch's
    ``(B, T)``, for a step without carried state). ``mfu``: that over ``world_size`` times this device's matmul
    rate, measured once at train start in the training dtype (:func:`~tvq_exp.measure.timing.matmul_peak_flops`:
    what this chip reaches on a large matmul). ``mfu_datasheet``: over the vendor's dense bf16 peak
    (:mod:`tvq_exp.measure.peaks`; MFU as papers quote it), only on a device the table names. Neither is
    logged for a model with no FLOP formula. :attr:`latest` keeps the last logged values (the console line).
    """

    def __init__(self) -> None:
        self._tokens = 0
        self._steps = 0
        self._start: float | None = None
        self._paused = 0.0
        self._pause_start = 0.0
        self._step_before = 0
        self._flops_per_token: float | None = None
        self._peak_flops: float | None = None
        self._datasheet_flops: float | None = None
        self._model: Decoder | None = None  # set at train start until the first batch's FLOPs are known
        self.latest: dict[str, float] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", None)
        self._start = None
        if isinstance(model, Decoder) and model.flops(1) is not None:
            self._model = model
            self._peak_flops = matmul_peak_flops(pl_module.device, training_dtype(trainer))
            self._datasheet_flops = device_peak_flops(pl_module.device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._model is not None and isinstance(batch, Mapping):
            b, t = batch["input"].shape
            flops = self._model.flops(t, b, backward=True)
            self._flops_per_token, self._model = None if flops is None else flops / (b * t), None
        if self._start is None:  # the first interval starts with an idle device
            sync(pl_module.device)
            self._start = time.perf_counter()
        self._step_before = trainer.global_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            sync(pl_module.device)
            self._pause_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._pause_start:
            sync(pl_module.device)
            self._paused += time.perf_counter() - self._pause_start
            self._pause_start = 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._tokens += batch_tokens(batch) * trainer.world_size
        if trainer.global_step == self._step_before:
            return
        self._steps += 1
        if not logging_step(trainer, trainer.global_step) or self._start is None:
            return
        sync(pl_module.device)
        now = time.perf_counter()
        busy = max(now - self._start - self._paused, 1e-9)
        metrics = {
            "throughput/tokens_per_s": self._tokens / busy,
            "throughput/step_time_ms": 1000.0 * busy / self._steps,
            "throughput/peak_mem_mb": peak_memory_mb(pl_module.device),
        }
        if self._flops_per_token is not None and self._peak_flops is not None:
            achieved = self._tokens * self._flops_per_token / busy
            metrics["throughput/tflops_per_s"] = achieved / 1e12
            metrics["throughput/mfu"] = achieved / (self._peak_flops * trainer.world_size)
            if self._datasheet_flops is not None:
                metrics["throughput/mfu_datasheet"] = achieved / (self._datasheet_flops * trainer.world_size)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self.latest = metrics
        self._tokens, self._steps, self._paused, self._start = 0, 0, 0.0, now
