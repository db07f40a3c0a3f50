"""Reading runs: find the run directories of a sweep, read their TensorBoard scalars and overrides into tables.

A *run* is a directory holding a Hydra ``.hydra/`` folder, a ``config.yaml`` or an ``error.txt``; a *sweep*
is any directory above runs (``logs/multiruns/<time>/``: one run per job).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tvq_exp.callbacks.final_hparams import FINAL_SCALARS
from tvq_exp.callbacks.train_clock import TAG as CLOCK_TAG

EVENT_GLOB = "events.out.tfevents.*"
FINAL_TIME = "final/train_time_s"
ERROR_FILE = "error.txt"

SUMMARY_METRICS = ("val/bpb", "val/loss", "train/loss", "train/bpb", "throughput/tokens_per_s")
LOWER_IS_BETTER_PREFIXES = ("val/", "train/")


def log_dir_above(start: str | Path | None = None) -> Path:
    """The ``logs`` folder that holds sweeps (``logs/multiruns``) in ``start`` (default: the working directory) or
    the nearest folder above it, so a notebook run from ``notebooks/`` (Jupyter's working directory) finds the
    repository's; ``<start>/logs`` when none does."""
    here = Path(start or Path.cwd()).resolve()
    found = next((d / "logs" for d in (here, *here.parents) if (d / "logs" / "multiruns").is_dir()), None)
    return found or here / "logs"


def latest_sweep(log_dir: str | Path | None = None) -> Path:
    """The newest sweep directory under ``<log_dir>/multiruns`` (default :func:`log_dir_above`), by modification
    time: a named sweep (``run_name=...``) and a timestamped one are compared by when they were written."""
    root = Path(log_dir) if log_dir is not None else log_dir_above()
    sweeps = [path for path in (root / "multiruns").glob("*") if path.is_dir()]
    if not sweeps:
        raise FileNotFoundError(f"no sweeps under {root / 'multiruns'}: run `python train.py -m ...` first")
    return max(sweeps, key=lambda path: (path.stat().st_mtime_ns, path.name))


def is_run_dir(path: Path) -> bool:
    """A run directory: has ``.hydra/``, ``config.yaml`` or ``error.txt``."""
    return (path / ".hydra").is_dir() or (path / "config.yaml").is_file() or (path / ERROR_FILE).is_file()


def find_runs(sweep_dir: str | Path) -> list[Path]:
    """Every run directory at or below ``sweep_dir`` (runs do not nest), sorted naturally (job 2 before 10)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no such sweep directory: {root}")
    if is_run_dir(root):
        return [root]
    runs = [path for child in sorted(root.iterdir()) if child.is_dir() for path in find_runs(child)]
    return sorted(runs, key=_natural_key)


def _natural_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in path.parts)


def event_files(run_dir: Path) -> list[Path]:
    """The run's TensorBoard event files (any depth below the run directory)."""
    return sorted(run_dir.rglob(EVENT_GLOB))


def load_scalars(run_dir: str | Path) -> pd.DataFrame:
    """Every scalar of a run: columns ``tag, step, wall_time, value`` (``wall_time`` in seconds since epoch)."""
    rows = []
    for path in event_files(Path(run_dir)):
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            rows.extend((tag, e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag))
    frame = pd.DataFrame(rows, columns=["tag", "step", "wall_time", "value"])
    return frame.sort_values(["tag", "wall_time", "step"], ignore_index=True)


def read_overrides(run_dir: str | Path) -> dict[str, str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``) as ``{key: value}`` (Hydra's ``+``/``~``
    prefixes dropped). Empty when the run was not started by Hydra."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    overrides = yaml.safe_load(path.read_text()) or []
    pairs = (str(item).lstrip("+~").split("=", 1) for item in overrides)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def train_seconds(scalars: pd.DataFrame, steps: Sequence[int] | pd.Series) -> np.ndarray:
    """Seconds since training started at each of ``steps``: the run's ``time/train_s`` clock
    (:class:`tvq_exp.callbacks.train_clock.TrainClock`, 0 at step 0) interpolated between its logged steps;
    NaN for a run without the clock. Event times are not used: they start at each run's first logged event,
    which differs by backend."""
    clock = scalars[scalars["tag"] == CLOCK_TAG].groupby("step")["value"].max()
    if not len(clock):
        return np.full(len(steps), math.nan)
    known_steps = np.concatenate([[0], clock.index.to_numpy(dtype=float)])
    known_seconds = np.concatenate([[0.0], clock.to_numpy(dtype=float)])
    return np.interp(np.asarray(steps, dtype=float), known_steps, known_seconds)


def run_summary(run_dir: Path, scalars: pd.DataFrame) -> dict[str, object]:
    """One row: status, steps, training time (``final/train_time_s``, else the training clock's last value:
    :func:`train_seconds`), and final and best value of each metric in
    ``SUMMARY_METRICS`` (best = the lowest, for ``train/`` and ``val/`` metrics). "final" is the value
    the run's HParams carry (``final/...``, written when training ends) where there is one, else the
    last logged value (which depends on ``log_every_n_steps``)."""
    row: dict[str, object] = {
        "run": str(run_dir),
        "status": "failed" if (run_dir / ERROR_FILE).is_file() else "ok",
    }
    row["steps"] = int(scalars["step"].max()) if len(scalars) else 0
    final_time = scalars.loc[scalars["tag"] == FINAL_TIME, "value"]
    clock = scalars.loc[scalars["tag"] == CLOCK_TAG, "value"]
    row["wall_time_s"] = (
        float((final_time if len(final_time) else clock).max()) if len(clock) + len(final_time) else math.nan
    )
    for metric in SUMMARY_METRICS:
        values = scalars.loc[scalars["tag"] == metric, "value"]
        carried = scalars.loc[scalars["tag"] == FINAL_SCALARS.get(metric, ""), "value"]
        final = carried if len(carried) else values
        row[f"final {metric}"] = float(final.iloc[-1]) if len(final) else math.nan
        if metric.startswith(LOWER_IS_BETTER_PREFIXES):
            row[f"best {metric}"] = float(values.min()) if len(values) else math.nan
    return row


def swept_keys(overrides: Sequence[dict[str, str]]) -> list[str]:
    """Override keys whose value differs between runs (all keys when there is a single run)."""
    keys = sorted({key for item in overrides for key in item})
    if len(overrides) <= 1:
        return keys
    return [key for key in keys if len({item.get(key) for item in overrides}) > 1]


def load_sweep(sweep_dir: str | Path) -> pd.DataFrame:
    """One row per run below ``sweep_dir``: ``run``, the swept overrides, ``status``, ``steps``,
    ``wall_time_s`` and ``final``/``best`` of each summary metric. ``df.attrs["swept"]`` lists the swept
    keys and ``df.attrs["scalars"]`` maps each run directory to its :func:`load_scalars` table."""
    runs = find_runs(sweep_dir)
    overrides = [read_overrides(run) for run in runs]
    swept = swept_keys(overrides)
    scalars = {str(run): load_scalars(run) for run in runs}
    rows = []
    for run, items in zip(runs, overrides, strict=True):
        summary = run_summary(run, scalars[str(run)])
        rows.append({"run": summary.pop("run"), **{key: items.get(key, "") for key in swept}, **summary})
    table = pd.DataFrame(rows)
    table.attrs["swept"] = swept
    table.attrs["scalars"] = scalars
    return table
