"""Shared by the cache-learning study's probes of trained models (``previous_token.py``, ``collisions.py``):
which jobs have a checkpoint, with what overrides, and the Markdown table of one result per row."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tvq_exp.tools.study.report import replace_between
from tvq_exp.tools.study.spec import load_study

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "studies/vq_cache_learning"


def trained_vq_jobs(
    out: Path, seed: int, runs: str = "", regime: str = "mqar"
) -> Iterator[tuple[str, str, list[str]]]:
    """``(row, checkpoint, overrides)`` of every trained VQ job of ``regime`` and ``seed`` in ``out`` (only the
    comma-separated ``runs`` when given); the overrides without the experiment and trainer ones, which
    ``tools/mqar_diagnosis/common.py``'s ``recall_model`` sets."""
    for job in load_study(REPO / "conf/study/vq_cache_learning.yaml").jobs:
        checkpoint = out / "runs" / job.id / "checkpoints/last.ckpt"
        chosen = not runs or job.run in runs.split(",")
        if job.regime != regime or job.seed != seed or not checkpoint.is_file() or not chosen:
            continue
        if "model=gau_dense" in job.overrides:  # the probes read layer 1's quantiser
            continue
        yield (
            job.run,
            str(checkpoint),
            [o for o in job.overrides if not o.startswith(("experiment=", "trainer."))],
        )


def rows_table(columns: list[str], results: dict[str, Any], cell: Callable[[Any, str], str]) -> str:
    """Markdown: a row per study row of ``results``, a column per name in ``columns`` (``cell(result, name)``)."""
    lines = ["| row | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for run, found in results.items():
        lines.append(f"| {run} | " + " | ".join(cell(found, c) for c in columns) + " |")
    return "\n".join(lines)


def probed_before(name: str) -> dict[str, Any]:
    """The rows of ``probes/<name>.json`` probed before (from other folders of a study trained in parts), or none."""
    target = OUT / "probes" / f"{name}.json"
    return json.loads(target.read_text()) if target.is_file() else {}


def write_probe(
    name: str, results: dict[str, Any], table: str, page: str | None, marker: str, indent: int | None = 1
) -> None:
    """``results`` into ``probes/<name>.json`` (``indent=None``: one line, for per-answer lists); with ``page``,
    ``table`` between its ``<!-- marker: begin/end -->`` lines."""
    target = OUT / "probes" / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=indent) + "\n")
    if page:
        Path(page).write_text(replace_between(Path(page).read_text(), marker, table))
