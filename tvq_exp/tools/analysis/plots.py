"""Plots of a sweep's runs: curves against step or wall time, final values against a swept key."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tvq_exp.tools.analysis.runs import train_seconds


def run_label(table: pd.DataFrame, index: int) -> str:
    """``key=value`` of the swept keys (the run directory's name when nothing is swept)."""
    row = table.iloc[index]
    parts = [f"{key.split('.')[-1]}={row[key]}" for key in table.attrs.get("swept", [])]
    return ", ".join(parts) or Path(str(row["run"])).name


def plot_curves(table: pd.DataFrame, metric: str, x: str = "step", ax: Axes | None = None) -> Axes:
    """``metric`` of every run against ``x``: ``"step"`` or ``"wall_time"`` (seconds since the run's training
    started, one clock for every backend: :func:`~tvq_exp.tools.analysis.runs.train_seconds`)."""
    if x not in ("step", "wall_time"):
        raise ValueError(f"x must be 'step' or 'wall_time', got {x!r}")
    ax = ax or plt.figure(figsize=(6, 4)).gca()
    for index, run in enumerate(table["run"]):
        scalars = table.attrs["scalars"][str(run)]
        curve = scalars[scalars["tag"] == metric]
        xs = curve["step"] if x == "step" else train_seconds(scalars, curve["step"])
        if len(curve) and not np.isnan(xs).all():
            ax.plot(xs, curve["value"], marker="o", markersize=3, label=run_label(table, index))
    ax.set_xlabel("step" if x == "step" else "training time (s)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return ax


def plot_final_vs_param(
    table: pd.DataFrame, param: str, metric: str = "val/bpb", ax: Axes | None = None
) -> Axes:
    """The final value of ``metric`` against the swept ``param`` (numeric axis when every value is a number)."""
    ax = ax or plt.figure(figsize=(5, 4)).gca()
    data = table[[param, f"final {metric}"]].dropna()
    values = pd.to_numeric(data[param], errors="coerce")
    if values.notna().all() and len(values):
        order = values.argsort()
        ax.plot(values.iloc[order], data[f"final {metric}"].iloc[order], marker="o")
        if values.min() > 0 and values.max() / values.min() >= 8:
            ax.set_xscale("log", base=2)
    else:
        ax.bar(data[param].astype(str), data[f"final {metric}"])
    ax.set_xlabel(param)
    ax.set_ylabel(f"final {metric}")
    ax.grid(alpha=0.3)
    return ax


def save(figure: Figure, path: Path) -> Path:
    """Save ``figure`` as ``path`` (tight layout) and close it."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
