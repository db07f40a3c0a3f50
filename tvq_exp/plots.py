"""Figures shared by the commands, the callbacks and the analysis tools (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Any

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


def state_figure(curves: Mapping[str, Sequence[tuple[float, float, float]]]) -> Figure:
    """Accuracy against recurrent state size (the Zoology figure): one line per backend, each point
    ``(state floats per layer, mean accuracy, spread over seeds)`` drawn with its spread as an error bar."""
    figure = Figure(figsize=(6, 4))
    ax = figure.subplots()
    for label, points in curves.items():
        points = sorted(points)
        ax.errorbar(
            [p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o", capsize=3,
            label=label,
        )  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("recurrent state (floats per layer per sequence)")
    ax.set_ylabel("accuracy at answer positions")
    ax.grid(alpha=0.3, which="both")
    if curves:
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def heatmap_figure(
    values: Sequence[Sequence[float]],
    rows: Sequence[str],
    columns: Sequence[str],
    title: str,
    xlabel: str = "",
) -> Figure:
    """A grid of accuracies in [0, 1] (e.g. passkey: context length x depth), each cell labelled."""
    figure = Figure(figsize=(1.2 + 0.9 * len(columns), 1.0 + 0.5 * len(rows)))
    ax = figure.subplots()
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), labels=list(columns))
    ax.set_yticks(range(len(rows)), labels=list(rows))
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            ax.text(
                j, i, f"{value:.2f}", ha="center", va="center", color="w" if value < 0.6 else "k", fontsize=8
            )
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    figure.colorbar(image, ax=ax)
    figure.tight_layout()
    return figure


def save_figure(figure: Figure, path: str | IO[bytes]) -> str | IO[bytes]:
    """Write ``figure`` as PNG to the file ``path`` names, or into an open binary file (a contained write,
    :func:`tvq_exp.files.atomic_write`); returns ``path``."""
    figure.savefig(path, dpi=110, format="png")
    return path


__all__ = ["heatmap_figure", "position_figure", "save_figure", "state_figure"]
