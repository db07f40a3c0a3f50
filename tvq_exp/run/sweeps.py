"""Sweep jobs: the objective a Hydra sweeper receives, and failure isolation inside a multirun.

``train.py`` wraps :func:`tvq_exp.run.train.train` with :func:`objective`: a single run behaves as before (an
error propagates), while inside ``python train.py -m ...`` a failing job writes its traceback to
``<run dir>/error.txt`` and returns +inf (the worst value of a minimised metric), so the other jobs
of the sweep still run and the Optuna sweeper records the trial as the worst instead of stopping; when the sweep
ends, :class:`SweepStatus` lists the failed jobs and ``train.py`` exits 1 naming them.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

ERROR_FILE = "error.txt"
DEFAULT_METRIC = "val/bpb"
log = logging.getLogger(__name__)


def in_multirun() -> bool:
    """True inside a job of ``python train.py -m ...`` (a Hydra multirun)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def metric_value(summary: Mapping[str, Any], metric: str) -> float:
    """The value of ``metric`` (``val/bpb`` or ``val/loss``) in a :func:`tvq_exp.run.train.train` summary.

    ``val/bpb`` is the best validation bits/byte (what the checkpoint callback monitors); other ``val/*``
    names are read from the last whole-split validation. Missing values are NaN.
    """
    if metric == DEFAULT_METRIC and summary.get("best_val_bpb") is not None:
        return float(summary["best_val_bpb"])
    stage, _, name = metric.partition("/")
    value = (summary.get(stage) or {}).get(name)
    return math.nan if value is None else float(value)


def write_error(run_dir: str | Path, error: BaseException) -> Path:
    """Write ``error``'s traceback to ``<run_dir>/error.txt``; returns the file."""
    path = Path(run_dir) / ERROR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    return path


def objective(cfg: DictConfig, task: Callable[[DictConfig], Mapping[str, Any]]) -> float:
    """Run ``task(cfg)`` and return ``cfg.optimized_metric`` (default ``val/bpb``) from its summary.

    In a multirun, an exception is caught: its traceback goes to ``<run dir>/error.txt``, the job
    returns +inf and the sweep goes on. Outside a multirun the exception propagates.
    """
    metric = str(cfg.get("optimized_metric") or DEFAULT_METRIC)
    if not in_multirun():
        return metric_value(task(cfg), metric)
    try:
        return metric_value(task(cfg), metric)
    except Exception as error:  # noqa: BLE001 - isolate any job failure from the rest of the sweep
        path = write_error(cfg.paths.output_dir, error)
        log.error("job failed (%s: %s); traceback in %s", type(error).__name__, error, path)
        return math.inf


class SweepStatus(Callback):
    """A Hydra callback (``conf/hydra/default.yaml``) that lists, when a multirun ends, the jobs that wrote an
    ``error.txt`` during it (any launcher: it reads the sweep dir); ``train.py`` then exits non-zero."""

    failed: list[Path] = []  # noqa: RUF012 - one sweep per process, read by train.py after Hydra returns

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()
        SweepStatus.failed = []

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(config.hydra.sweep.dir)
        errors = folder.rglob(ERROR_FILE) if folder.is_dir() else []
        SweepStatus.failed = sorted(p for p in errors if p.stat().st_mtime >= self.started - 1)


__all__ = ["ERROR_FILE", "SweepStatus", "in_multirun", "metric_value", "objective", "write_error"]
