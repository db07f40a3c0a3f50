"""A study's result files, grouped by (run, regime), and the mean ± spread over seeds the reports print."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tvq_exp.tools.study.spec import plain_name

Group = tuple[str, str]


def load_results(out: Path) -> list[dict[str, Any]]:
    """Every result file of a study folder, sorted by job id; a malformed one raises ``ValueError`` naming it."""
    return sorted((read_result(p) for p in sorted((out / "results").glob("*.json"))), key=lambda r: r["id"])


def read_result(path: Path) -> dict[str, Any]:
    """One result file, checked: a JSON object with ``id``, ``run``, ``regime`` (plain names: they name figures),
    an integer ``seed`` and ``evaluations`` (plain names, each a mapping); ``ValueError`` naming the file."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a JSON result file ({' '.join(str(error).split())[:100]})") from None
    if not isinstance(result, dict):
        raise ValueError(f"{path}: a result file is a JSON object, got {type(result).__name__}")
    for key in ("id", "run", "regime"):
        if not plain_name(result.get(key)) and not (key == "id" and _job_id(result.get(key))):
            raise ValueError(
                f"{path}: {key}={result.get(key)!r} must be a plain name (no '/', '..' or leading '.')"
            )
    if not isinstance(result.get("seed"), int) or isinstance(result.get("seed"), bool):
        raise ValueError(f"{path}: seed={result.get('seed')!r} must be an integer")
    evaluations = result.get("evaluations")
    if not isinstance(evaluations, dict) or not all(isinstance(v, dict) for v in evaluations.values()):
        raise ValueError(f"{path}: evaluations must map each evaluation's name to its result")
    bad = [name for name in evaluations if not plain_name(name)]
    if bad:
        raise ValueError(
            f"{path}: evaluation name {bad[0]!r} must be a plain name (no '/', '..' or leading '.')"
        )
    return result


def _job_id(value: object) -> bool:
    """A job id: ``<run>--<regime>--s<seed>``, each part plain."""
    parts = value.split("--") if isinstance(value, str) else []
    return len(parts) == 3 and all(map(plain_name, parts))


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


__all__ = ["Group", "cell", "grouped", "load_results", "mean_and_spread", "read_result"]
