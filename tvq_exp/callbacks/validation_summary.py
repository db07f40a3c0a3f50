"""One summary line per validation on the console."""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tvq_exp.callbacks.throughput import Throughput, batch_tokens


def format_duration(seconds: float) -> str:
    """``3725.2`` -> ``"1:02:05"``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def mfu_parts(trainer: L.Trainer) -> list[str]:
    """``MFU 12.3% of matmul, 10.1% of datasheet`` from the throughput callback's latest interval (nothing before
    it logged, or for a model without a FLOP count; the datasheet part on devices with a known peak)."""
    callbacks = getattr(trainer, "callbacks", [])
    latest = next((c.latest for c in callbacks if isinstance(c, Throughput)), {})
    if "throughput/mfu" not in latest:
        return []
    text = f"MFU {100 * latest['throughput/mfu']:.1f}% of matmul"
    if "throughput/mfu_datasheet" in latest:
        text += f", {100 * latest['throughput/mfu_datasheet']:.1f}% of datasheet"
    return [text]


class ValidationSummary(Callback):
    """Prints one line per validation during ``fit``:
    ``step 1000 | val/bpb 1.2345 | train/loss 0.9876 | 12.3k tok/s | MFU 41.0% of matmul, 38.2% of datasheet |
    0:05:12`` (image runs give ``val/bpd``, the synthetic probes add ``val/acc``; MFU: :func:`mfu_parts`).
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
        bits = "val/bpd" if "val/bpd" in metrics else "val/bpb"
        for name in (bits, "val/acc", "train/loss"):
            if name in metrics:
                parts.append(f"{name} {float(metrics[name]):.4f}")
        parts.append(f"{self._tokens / max(self._train_time, 1e-9) / 1000:.1f}k tok/s")
        parts += mfu_parts(trainer)
        parts.append(format_duration(time.perf_counter() - self._start))
        print(" | ".join(parts), file=sys.stdout, flush=True)
