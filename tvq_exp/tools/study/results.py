"""A study's result files, grouped by (run, regime), and the mean ± spread over seeds the reports print."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Group = tuple[str, str]


def load_results(out: Path) -> list[dict[str, Any]]:
    """Every result file of a study folder, sorted by job id."""
    return sorted(
        (json.loads(p.read_text()) for p in (out / "results").glob("*.json")), key=lambda r: r["id"]
    )


def grouped(results: Sequence[dict[str, Any]], evaluation: str) -> dict[Group, list[dict[str, Any]]]:
    """Evaluation ``evaluation`` of every job, by (run, regime), in the order the results come."""
    groups: dict[Group, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        if evaluation in result["evaluations"]:
            groups[result["run"], result["regime"]].append(
                {"seed": result["seed"], **result["evaluations"][evaluation]}
            )
    return dict(groups)


def mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, half the range)``; the spread of a single value is 0."""
    return statistics.fmean(values), (max(values) - min(values)) / 2


def cell(values: Sequence[float], signed: bool = False) -> str:
    """``2.7160 ± 0.0040`` (or the value alone for one seed; ``signed``: ``+0.0019``)."""
    mean, spread = mean_and_spread(values)
    value = f"{mean:+.4f}" if signed else f"{mean:.4f}"
    return value if len(values) == 1 else f"{value} ± {spread:.4f}"


__all__ = ["Group", "cell", "grouped", "load_results", "mean_and_spread"]
