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
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from tvq_exp.files import check_writable
from tvq_exp.tools.analysis.frontier import REPO, frontier_config, run_frontier
from tvq_exp.tools.analysis.report import markdown_table, write_report
from tvq_exp.tools.analysis.runs import find_runs
from tvq_exp.tools.arguments import OneLineParser, plain_names, positive_float, positive_int
from tvq_exp.tools.study.report import into_page
from tvq_exp.tools.study.report import write_report as write_study_report
from tvq_exp.tools.study.runner import run_jobs, select
from tvq_exp.tools.study.spec import load_study

CONF = REPO / "conf"


def report_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis SWEEP_DIR --out report/``."""
    parser = OneLineParser(prog="python -m tvq_exp.analysis", description="Summarise a sweep's runs.")
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
    writable(args.out)  # a read-only or full folder stops now, before the runs are read
    table = write_report(folder, args.out)
    failed = int(table["status"].ne("ok").sum()) if "status" in table else 0
    print(f"{len(table)} runs ({failed} failed) -> {Path(args.out) / 'summary.md'}")
    damaged = [status for status in table.get("status", []) if str(status).startswith("damaged: ")]
    if damaged:
        raise SystemExit(
            f"error: {len(damaged)} of {len(table)} runs are damaged and were not read "
            f"({damaged[0].removeprefix('damaged: ')}); the report marks them"
        )


def frontier_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis frontier [--models ...] [--budget S] [--out DIR] [overrides ...]``."""
    parser = OneLineParser(
        prog="python -m tvq_exp.analysis frontier",
        description="Train each backend for a fixed wall-clock budget (CPU) and plot val bits/byte vs time.",
    )
    parser.add_argument(
        "--models",
        type=model_presets,
        default=",".join(frontier_config()["models"]),
        help="comma-separated model configs",
    )
    parser.add_argument("--budget", type=positive_float, default=120.0, help="training seconds per model")
    parser.add_argument("--out", default="frontier", help="folder for runs/, frontier.md and frontier.png")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides for every model (key=value)")
    args = parser.parse_args(argv)
    bad = [item for item in args.overrides if "=" not in item or item.startswith(("hydra.", "paths."))]
    if bad:
        parser.error(f"override {bad[0]!r}: must be key=value of train.py (not hydra.* or paths.*: the frontier "
                     "places its runs in --out)")  # fmt: skip
    writable(args.out)  # before the first model trains, not after the last
    try:
        table = run_frontier(args.out, args.models, args.budget, args.overrides)
    except subprocess.CalledProcessError as error:
        raise SystemExit(
            f"error: a frontier run failed (exit {error.returncode}: {' '.join(map(str, error.cmd[2:4]))} ...); "
            "its error is above"
        ) from None
    print(markdown_table(table.drop(columns=["run"])))


def writable(folder: str | Path) -> None:
    """:func:`~tvq_exp.files.check_writable` with its refusal as one ``error:`` line (exit 1)."""
    try:
        check_writable(folder)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: --out {folder}: {' '.join(str(error).split())}") from None


def model_presets(text: str) -> list[str]:
    """``--models``: comma-separated names of ``conf/model`` presets."""
    names = plain_names(text)
    known = sorted(path.stem for path in (CONF / "model").glob("*.yaml"))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown model {unknown[0]!r}; choose from {', '.join(known)}")
    return names


def seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated integers >= 0."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not all(item.isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got {text!r}")
    return [int(item) for item in items]


def study_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis study run|report STUDY.yaml --out DIR [...]``."""
    parser = OneLineParser(prog="python -m tvq_exp.analysis study", description="Run or report a study.")
    parser.add_argument("action", choices=["run", "report"])
    parser.add_argument("study", help="the study file (conf/study/<name>.yaml)")
    parser.add_argument("--out", required=True, help="the study folder (runs/ and results/)")
    parser.add_argument("--runs", default="", help="comma-separated runs (default: all)")
    parser.add_argument("--regimes", default="", help="comma-separated regimes (default: all)")
    parser.add_argument("--seeds", type=seeds, default=[], help="comma-separated seeds (default: all)")
    parser.add_argument(
        "--parallel", type=positive_int, default=1, help="jobs at a time (the CPU cores are shared)"
    )
    parser.add_argument(
        "--cores", type=positive_int, default=None, help="CPU cores the study may use (default: all)"
    )
    parser.add_argument("--figures", default=None, help="folder for the report's PNGs (default: --out)")
    parser.add_argument(
        "--page", default=None, help="report: also put the report between this docs page's report markers"
    )
    args = parser.parse_args(argv)
    try:
        study, out = load_study(args.study), Path(args.out)
        if args.action == "report":
            figures = Path(args.figures) if args.figures else None
            report = write_study_report(out, f"Study {study.name}", figures, study.comparisons)
            print(into_page(report, Path(args.page), figures or out) if args.page else report)
            return
    except (
        OSError,
        ValueError,
    ) as error:  # a missing or malformed study or result file, an unwritable folder
        raise SystemExit(f"error: {' '.join(str(error).split())}") from None
    split = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    unknown = [f"--runs {r}" for r in split(args.runs) if r not in study.runs]
    unknown += [f"--regimes {r}" for r in split(args.regimes) if r not in study.regimes]
    if unknown:
        raise SystemExit(f"error: {unknown[0]}: not in {args.study} (runs: {', '.join(study.runs)}; regimes: "
                         f"{', '.join(study.regimes)})")  # fmt: skip
    writable(out)  # before the first job trains
    jobs = select(study, split(args.runs), split(args.regimes), args.seeds)
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
