"""Training callbacks: throughput to TensorBoard, a one-line summary per validation, a quiet progress bar."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tvq_exp.flops import model_flops
from tvq_exp.model import Decoder


def batch_tokens(batch: Any) -> int:
    """Tokens in one batch on this rank: ``batch["input"]`` is ``(B, T)``."""
    return int(batch["input"].numel()) if isinstance(batch, Mapping) else 0


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident set size (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def precision_dtype(precision: str | int | None) -> torch.dtype:
    """The matmul dtype of a Lightning ``precision``: ``bf16-*`` -> bf16, ``16-*`` -> fp16, ``64-*`` -> fp64,
    anything else fp32."""
    text = str(precision)
    prefixes = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
    return next((dtype for prefix, dtype in prefixes.items() if text.startswith(prefix)), torch.float32)


def matmul_peak_flops(
    device: torch.device, dtype: torch.dtype, size: int | None = None, reps: int = 5
) -> float:
    """Measured matmul FLOP/s of ``device`` in ``dtype``: the fastest of ``reps`` square ``(n, n) @ (n, n)``
    products after one warm-up (``n`` 8192 on CUDA, 1024 elsewhere: ~0.2 s on one CPU core). On CUDA
    the peak-memory statistics are reset afterwards, so the benchmark's matrices do not count."""
    n = size or (8192 if device.type == "cuda" else 1024)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(reps + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    del a, b
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return 2 * n**3 / best


def format_duration(seconds: float) -> str:
    """``3725.2`` -> ``"1:02:05"``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Throughput(Callback):
    """Logs ``throughput/{tokens_per_s, step_time_ms, peak_mem_mb, tflops_per_s, mfu}`` every
    ``log_every_n_steps`` optimiser steps, averaged over the interval. Tokens count every rank
    (``world_size`` times the local batch).

    ``tflops_per_s``: model FLOPs of all ranks per second of step time, from the matmul FLOPs per token
    of a training step (:func:`~tvq_exp.flops.model_flops` forward + backward, computed once from the
    first batch's ``(B, T)``, for a step without carried state). ``mfu``: that over ``world_size``
    times this device's matmul peak, measured once at train start in the training dtype
    (:func:`matmul_peak_flops`). Neither is logged for a model with no FLOP formula.
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
        if isinstance(model, Decoder) and model_flops(model, 1) is not None:
            self._model = model
            self._peak_flops = matmul_peak_flops(pl_module.device, precision_dtype(trainer.precision))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._model is not None and isinstance(batch, Mapping):
            b, t = batch["input"].shape
            flops = model_flops(self._model, t, b, backward=True)
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


class ValidationSummary(Callback):
    """Prints one line per validation during ``fit``:
    ``step 1000 | val/bpb 1.2345 | train/loss 0.9876 | 12.3k tok/s | 0:05:12``.
    Tokens per second are over the training time so far (all ranks, validation time excluded)."""

    def __init__(self) -> None:
        self._start = 0.0
        self._train_time = 0.0
        self._batch_start = 0.0
        self._tokens = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._train_time += time.perf_counter() - self._batch_start
        self._tokens += batch_tokens(batch) * trainer.world_size

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.report(trainer)

    @rank_zero_only
    def report(self, trainer: L.Trainer) -> None:
        """Print the summary line of the latest validation."""
        metrics = trainer.callback_metrics
        parts = [f"step {trainer.global_step}"]
        for name in ("val/bpb", "train/loss"):
            if name in metrics:
                parts.append(f"{name} {float(metrics[name]):.4f}")
        parts.append(f"{self._tokens / max(self._train_time, 1e-9) / 1000:.1f}k tok/s")
        parts.append(format_duration(time.perf_counter() - self._start))
        print(" | ".join(parts), file=sys.stdout, flush=True)


class QuietProgressBar(RichProgressBar):
    """Rich progress bar that disappears when done and hides Lightning's ``v_num``."""

    def __init__(self, refresh_rate: int = 10) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=False)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
