"""The GPU check's training section (:mod:`.gpu`): the paper-size model's compiled training step on one GPU, its
throughput, MFU and peak memory read from the throughput callback's rows in a CSV logger's ``metrics.csv``, and
where its time goes: the device profile of optimiser steps 40..44 (``debug=device_profile``), its largest rows."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tvq_exp.tools.train_command import run_train

TRAIN_SHAPE = (
    "experiment=enwik8_paper", "trainer=gpu", "trainer.devices=1",
    "global_batch_size=null",
    "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000000", "trainer.limit_val_batches=1",
    "trainer.max_steps=1000000", "trainer.log_every_n_steps=10", "logger=csv",
    "trainer.enable_progress_bar=false", "++logger.csv.flush_logs_every_n_steps=10",
    "debug=device_profile", "callbacks.device_profile.skip=40", "callbacks.device_profile.rows=20",
)  # fmt: skip


TRAIN_KERNELS = ("auto", "plain", "triton")  # the window + cache step (``model.attention.kernel``)


def throughput(metrics_csv: Path, warmup: float = 0.2) -> dict[str, Any]:
    """Tokens/s, TFLOP/s and both MFUs (medians over the rows after the first ``warmup`` share: compilation and
    warm-up) and peak memory (the largest) that the throughput callback logged to a CSV logger's ``metrics.csv``."""
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("throughput/tokens_per_s")]
    if not rows:
        raise ValueError(f"{metrics_csv}: no throughput/tokens_per_s rows")
    steady = rows[int(len(rows) * warmup) :] or rows
    medians = {
        key: statistics.median(float(r[f"throughput/{key}"]) for r in steady)
        for key in ("tokens_per_s", "tflops_per_s", "mfu", "mfu_datasheet")
        if all(r.get(f"throughput/{key}") for r in steady)
    }
    return {
        **medians,
        "peak_mem_mb": max(float(r["throughput/peak_mem_mb"]) for r in rows),
        "last_step": int(float(rows[-1]["step"])),
        "rows": len(rows),
    }


def training_section(
    shape: Sequence[str], seconds: float, batch_sizes: Sequence[int], budget_s: float, compile_s: float = 0.0
) -> dict[str, Any]:
    """Train ``shape`` for ``seconds`` plus ``compile_s`` (its compilation) at the first batch size in
    ``batch_sizes`` that fits while ``budget_s`` lasts; its throughput."""
    start, tried = time.monotonic(), []
    for batch in batch_sizes:
        left = budget_s - (time.monotonic() - start)
        if left < seconds / 2:
            tried.append({"batch_size": batch, "error": "skipped: budget"})
            break
        with tempfile.TemporaryDirectory() as scratch:
            limit = time.strftime("%H:%M:%S", time.gmtime(min(seconds + compile_s, left - 15)))
            args = [*shape, f"data.batch_size={batch}", f"++trainer.max_time=00:{limit}", f"paths.log_dir={scratch}",
                    "run_name=bench_gpu"]  # fmt: skip
            run_dir = Path(scratch) / "runs" / "bench_gpu"
            metrics = run_dir / "csv" / "metrics.csv"
            figures = {
                "command": "python train.py " + " ".join(args[:-2]),
                "batch_size": batch,
                "tried": tried,
            }
            try:
                done = run_train(args, timeout=left)
            except subprocess.TimeoutExpired as stopped:
                cut = f"stopped at the section's {budget_s:.0f} s budget"
                if _logged(metrics):  # the rows flushed before the stop still give the figures
                    return {**figures, "stopped": cut, **throughput(metrics, warmup=0.5), **_profile(run_dir)}
                tried.append({"batch_size": batch, "error": cut, "log_tail": _tail(stopped.stderr)})
                break
            if done.returncode == 0 and _logged(metrics):
                warmup = compile_s / (seconds + compile_s)
                return {**figures, **throughput(metrics, warmup=warmup), **_profile(run_dir)}
            error = (done.stderr.strip().splitlines() or ["?"])[-1]
            tried.append({"batch_size": batch, "error": error})
            if "out of memory" not in error.lower():  # a smaller batch only cures a lack of memory
                break
    return {"command": "python train.py " + " ".join(shape), "tried": tried, "error": "no batch size fitted"}


def _profile(run_dir: Path) -> dict[str, Any]:
    """``{"profile": ...}``: the device profile the run wrote (:class:`~tvq_exp.callbacks.device_profile.DeviceProfile`),
    or nothing where it stopped before the window."""
    path = run_dir / "device-profile.json"
    return {"profile": json.loads(path.read_text())} if path.is_file() else {}


def _logged(metrics_csv: Path) -> bool:
    """Whether the throughput callback has flushed a row to ``metrics_csv``."""
    return metrics_csv.is_file() and "throughput/tokens_per_s" in metrics_csv.read_text()


def stopped_output(text: str | bytes | None) -> str:
    """What a process stopped at its timeout had written (``TimeoutExpired.stdout``/``stderr``: bytes, text or None)."""
    return text.decode(errors="replace") if isinstance(text, bytes) else text or ""


def _tail(text: str | bytes | None, lines: int = 8) -> list[str]:
    """The last ``lines`` lines of a stopped process's output (what it was doing when the budget ran out)."""
    return stopped_output(text).strip().splitlines()[-lines:]
