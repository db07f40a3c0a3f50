"""``python -m tvq_exp.analysis``::

python -m tvq_exp.analysis SWEEP_DIR --out report/        # report/summary.md + PNG plots
python -m tvq_exp.analysis frontier --budget 120 --out docs/frontier/
    # trains each backend at equal size on the Gutenberg books for a fixed wall-clock budget (CPU),
    # then plots validation bits/byte against training time (frontier.md + frontier.png)
python -m tvq_exp.analysis study run conf/study/long_context.yaml --out studies/long_context [--runs a,b]
    [--regimes r] [--seeds 1,2] [--parallel 2]      # the jobs not done yet, one result file each
python -m tvq_exp.analysis study report conf/study/long_context.yaml --out studies/long_context
    [--figures docs/figures]                        # tables and position plots from the result files
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from tvq_exp.tools.analysis.frontier import frontier_config, run_frontier
from tvq_exp.tools.analysis.report import markdown_table, write_report
from tvq_exp.tools.analysis.runs import find_runs
from tvq_exp.tools.study.report import write_report as write_study_report
from tvq_exp.tools.study.runner import run_jobs, select
from tvq_exp.tools.study.spec import load_study


def report_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis SWEEP_DIR --out report/``."""
    parser = argparse.ArgumentParser(
        prog="python -m tvq_exp.analysis", description="Summarise a sweep's runs."
    )
    parser.add_argument(
        "sweep_dir", help="a sweep directory (logs/multiruns/<time>) or a single run directory"
    )
    parser.add_argument("--out", default="report", help="folder for summary.md and the PNG plots")
    args = parser.parse_args(argv)
    folder = Path(args.sweep_dir)
    if not folder.is_dir():
        raise SystemExit(
            f"error: {folder}: no such folder; give a sweep directory (logs/multiruns/<name>) or a run"
        )
    if not find_runs(folder):
        raise SystemExit(
            f"error: {folder} holds no run (no folder with .hydra/, config.yaml or error.txt); give a sweep "
            "directory (logs/multiruns/<name>) or a run directory"
        )
    table = write_report(folder, args.out)
    failed = int(table["status"].ne("ok").sum()) if "status" in table else 0
    print(f"{len(table)} runs ({failed} failed) -> {Path(args.out) / 'summary.md'}")


def frontier_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis frontier [--models ...] [--budget S] [--out DIR] [overrides ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tvq_exp.analysis frontier",
        description="Train each backend for a fixed wall-clock budget (CPU) and plot val bits/byte vs time.",
    )
    parser.add_argument(
        "--models", default=",".join(frontier_config()["models"]), help="comma-separated model configs"
    )
    parser.add_argument("--budget", type=float, default=120.0, help="training seconds per model")
    parser.add_argument("--out", default="frontier", help="folder for runs/, frontier.md and frontier.png")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides for every model (key=value)")
    args = parser.parse_args(argv)
    table = run_frontier(args.out, args.models.split(","), args.budget, args.overrides)
    print(markdown_table(table.drop(columns=["run"])))


def study_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis study run|report STUDY.yaml --out DIR [...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tvq_exp.analysis study", description="Run or report a study."
    )
    parser.add_argument("action", choices=["run", "report"])
    parser.add_argument("study", help="the study file (conf/study/<name>.yaml)")
    parser.add_argument("--out", required=True, help="the study folder (runs/ and results/)")
    parser.add_argument("--runs", default="", help="comma-separated runs (default: all)")
    parser.add_argument("--regimes", default="", help="comma-separated regimes (default: all)")
    parser.add_argument("--seeds", default="", help="comma-separated seeds (default: all)")
    parser.add_argument("--parallel", type=int, default=1, help="jobs at a time (the CPU cores are shared)")
    parser.add_argument("--cores", type=int, default=None, help="CPU cores the study may use (default: all)")
    parser.add_argument("--figures", default=None, help="folder for the report's PNGs (default: --out)")
    args = parser.parse_args(argv)
    try:
        study, out = load_study(args.study), Path(args.out)
    except (OSError, ValueError) as error:  # a missing or malformed study file
        raise SystemExit(f"error: {' '.join(str(error).split())}") from None
    if args.action == "report":
        print(write_study_report(out, f"Study {study.name}", Path(args.figures) if args.figures else None))
        return
    split = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    jobs = select(study, split(args.runs), split(args.regimes), [int(s) for s in split(args.seeds)])
    if not jobs:
        raise SystemExit(f"error: --runs/--regimes/--seeds select no job of {args.study}")
    lines = run_jobs(study, jobs, out, args.parallel, args.cores)
    for line in lines:
        print(line, flush=True)
    failed = [line.split(":", 1)[0] for line in lines if ": failed, " in line]
    if failed:
        raise SystemExit(
            f"error: {len(failed)} of {len(lines)} study jobs failed ({', '.join(failed)}); see above"
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Dispatch: ``frontier ...``, ``study ...`` or ``SWEEP_DIR --out DIR``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    matplotlib.use("Agg")
    if argv and argv[0] == "frontier":
        frontier_main(argv[1:])
    elif argv and argv[0] == "study":
        study_main(argv[1:])
    else:
        report_main(argv)
