"""``python -m tools.vq_cache_learning.train_curves --runs A,B [--seeds 1,2] [--out DIR] [--page docs/vq_cache_learning.md]``:
the training accuracy of ``mqar`` jobs, by quarter of the run, from their TensorBoard logs (``train/acc``, logged at
every logging step of ``runs/<job>/tensorboard``).

The measurement of the rows whose training forward differs from their evaluation: under ``codebook.hard_warmup`` the
training accuracy is that of the keys the window reads in training (the blend), where every evaluation reads the codes.
Writes ``studies/vq_cache_learning/probes/mqar--train-acc.json`` (a row per job, ``<row> s<seed>``, merged into the
file's) and, with
``--page``, the table between the page's ``<!-- train accuracy: begin -->`` and ``<!-- train accuracy: end -->`` lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tools.vq_cache_learning.common import OUT, REPO, probed_before, rows_table, write_probe
from tvq_exp.tools.study.spec import load_study

QUARTERS = 4


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, train/acc)`` of the newest TensorBoard log under ``run_dir``."""
    logs = sorted((run_dir / "tensorboard").rglob("events*"), key=lambda p: p.stat().st_mtime)
    if not logs:
        raise FileNotFoundError(f"{run_dir}: no TensorBoard log under tensorboard/")
    events = EventAccumulator(str(logs[-1]))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("train/acc")]


def by_quarter(points: list[tuple[int, float]], steps: int) -> dict[str, float]:
    """Mean training accuracy over each quarter of ``steps`` optimiser steps (steps are 0-based)."""
    size = steps // QUARTERS
    empty = [q for q in range(QUARTERS) if not any(q * size <= s < (q + 1) * size for s, _ in points)]
    if empty:
        raise ValueError(f"no train/acc point in quarter(s) {empty} of {steps} steps: was the run finished?")
    return {
        f"{q * size}-{(q + 1) * size}": statistics.fmean(
            v for s, v in points if q * size <= s < (q + 1) * size
        )
        for q in range(QUARTERS)
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="train_curves.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="comma-separated rows")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument("--out", type=Path, default=OUT, help="the study folder whose runs/ hold the logs")
    parser.add_argument(
        "--page", default=None, help="write the table into this page's train-accuracy markers"
    )
    args = parser.parse_args(argv)
    results = probed_before("mqar--train-acc")
    for job in load_study(REPO / "conf/study/vq_cache_learning.yaml").jobs:
        seeds = [int(seed) for seed in args.seeds.split(",")]
        if job.regime == "mqar" and job.seed in seeds and job.run in args.runs.split(","):
            steps = int(next(o for o in job.overrides if o.startswith("trainer.max_steps=")).split("=")[1])
            results[f"{job.run} s{job.seed}"] = by_quarter(curve(args.out / "runs" / job.id), steps)
    results = dict(sorted(results.items()))
    columns = list(next(iter(results.values())))
    table = rows_table([f"steps {c}" for c in columns], results, lambda found, c: f"{found[c[6:]]:.3f}")
    print(table)
    write_probe("mqar--train-acc", results, table, args.page, "train accuracy")


if __name__ == "__main__":
    main(sys.argv[1:])
