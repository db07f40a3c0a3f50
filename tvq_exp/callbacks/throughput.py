"""Throughput to TensorBoard: tokens/s, step time, peak memory, TFLOP/s and model-FLOP utilisation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from tvq_exp.measure.memory import peak_memory_mb
from tvq_exp.measure.timing import matmul_peak_flops
from tvq_exp.models.decoder import Decoder


def batch_tokens(batch: Any) -> int:
    """Tokens in one batch on this rank: ``batch["input"]`` is ``(B, T)``."""
    return int(batch["input"].numel()) if isinstance(batch, Mapping) else 0


def precision_dtype(precision: str | int | None) -> torch.dtype:
    """The matmul dtype of a Lightning ``precision``: ``bf16-*`` -> bf16, ``16-*`` -> fp16, ``64-*`` -> fp64,
    anything else fp32."""
    text = str(precision)
    prefixes = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
    return next((dtype for prefix, dtype in prefixes.items() if text.startswith(prefix)), torch.float32)


class Throughput(Callback):
    """Logs ``throughput/{tokens_per_s, step_time_ms, peak_mem_mb, tflops_per_s, mfu}`` every
    ``log_every_n_steps`` optimiser steps, averaged over the interval. Tokens count every rank
    (``world_size`` times the local batch).

    ``tflops_per_s``: model FLOPs of all ranks per second of step time, from the matmul FLOPs per token
    of a training step (:meth:`~tvq_exp.models.decoder.Decoder.flops` forward + backward, computed once from the
    first batch's ``(B, T)``, for a step without carried state). ``mfu``: that over ``world_size``
    times this device's matmul peak, measured once at train start in the training dtype
    (:func:`~tvq_exp.measure.timing.matmul_peak_flops`). Neither is logged for a model with no FLOP formula.
    """

    def __init__(self) -> None:
        self._tokens = 0
        self._steps = 0
        self._busy = 0.0
        self._batch_start = 0.0
        self._step_before = 0
        self._flops_per_token: float | None = None
        self._peak_flops: float | None = None
        self._model: Decoder | None = None  # set at train start until the first batch's FLOPs are known

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", None)
        if isinstance(model, Decoder) and model.flops(1) is not None:
            self._model = model
            self._peak_flops = matmul_peak_flops(pl_module.device, precision_dtype(trainer.precision))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._model is not None and isinstance(batch, Mapping):
            b, t = batch["input"].shape
            flops = self._model.flops(t, b, backward=True)
            self._flops_per_token, self._model = None if flops is None else flops / (b * t), None
        self._batch_start = time.perf_counter()
        self._step_before = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._busy += time.perf_counter() - self._batch_start
        self._tokens += batch_tokens(batch) * trainer.world_size
        if trainer.global_step == self._step_before:
            return
        self._steps += 1
        if trainer.global_step % max(1, trainer.log_every_n_steps):
            return
        metrics = {
            "throughput/tokens_per_s": self._tokens / max(self._busy, 1e-9),
            "throughput/step_time_ms": 1000.0 * self._busy / self._steps,
            "throughput/peak_mem_mb": peak_memory_mb(pl_module.device),
        }
        if self._flops_per_token is not None and self._peak_flops is not None:
            achieved = self._tokens * self._flops_per_token / max(self._busy, 1e-9)
            metrics["throughput/tflops_per_s"] = achieved / 1e12
            metrics["throughput/mfu"] = achieved / (self._peak_flops * trainer.world_size)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self._tokens, self._steps, self._busy = 0, 0, 0.0
