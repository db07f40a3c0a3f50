"""``python -m tvq_exp.analysis``::

    python -m tvq_exp.analysis SWEEP_DIR --out report/        # report/summary.md + PNG plots
    python -m tvq_exp.analysis frontier --budget 120 --out docs/frontier/
        # trains each backend at equal size on the Gutenberg books for a fixed wall-clock budget (CPU),
        # then plots validation bits/byte against training time (frontier.md + frontier.png)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from tvq_exp.tools.analysis.frontier import frontier_config, run_frontier
from tvq_exp.tools.analysis.report import markdown_table, write_report


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
    table = write_report(args.sweep_dir, args.out)
    print(f"{len(table)} runs -> {Path(args.out) / 'summary.md'}")


def frontier_main(argv: Sequence[str]) -> None:
    """``python -m tvq_exp.analysis frontier [--models ...] [--budget S] [--out DIR] [overrides ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tvq_exp.analysis frontier",
        description="Train each backend for a fixed wall-clock budget (CPU) and plot val bits/byte vs time.",
    )
    parser.add_argument("--models", default=",".join(frontier_config()["models"]), help="comma-separated model configs")
    parser.add_argument("--budget", type=float, default=120.0, help="training seconds per model")
    parser.add_argument("--out", default="frontier", help="folder for runs/, frontier.md and frontier.png")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides for every model (key=value)")
    args = parser.parse_args(argv)
    table = run_frontier(args.out, args.models.split(","), args.budget, args.overrides)
    print(markdown_table(table.drop(columns=["run"])))


def main(argv: Sequence[str] | None = None) -> None:
    """Dispatch: ``frontier ...`` or ``SWEEP_DIR --out DIR``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    matplotlib.use("Agg")
    if argv and argv[0] == "frontier":
        frontier_main(argv[1:])
    else:
        report_main(argv)
