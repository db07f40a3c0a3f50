"""Figures shared by the commands, the callbacks and the analysis tools (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure  # a bare Figure: no pyplot, so importing this never changes the backend


def position_figure(curves: Mapping[str, Sequence[Mapping[str, Any]]], unit: str = "bits/byte") -> Figure:
    """Bits per token against position (tokens since the last state reset), one line per named curve.

    ``curves`` maps a label to its position buckets (``{"start", "end", "bpb"}`` each, as
    :class:`~tvq_exp.models.metrics.PositionBits` gives them); each bucket is drawn at its geometric
    middle on a log axis.
    """
    figure = Figure(figsize=(6, 4))
    ax = figure.subplots()
    for label, buckets in curves.items():
        xs = [max(1.0, (b["start"] * b["end"]) ** 0.5 if b["start"] else b["end"] / 2) for b in buckets]
        ax.plot(xs, [b["bpb"] for b in buckets], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position since the last state reset (tokens, bucket middle)")
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3, which="both")
    if curves:
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def save_figure(figure: Figure, path: str) -> str:
    """Write ``figure`` as PNG; returns the path."""
    figure.savefig(path, dpi=110)
    return path


__all__ = ["position_figure", "save_figure"]
