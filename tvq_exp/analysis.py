"""``python -m tvq_exp.analysis``: run tables, reports, plots and the frontier (kept at this path; the code is
in :mod:`tvq_exp.tools.analysis`). In Python: :func:`load_sweep` (one row per run), :func:`load_scalars`
(long table of every scalar), :func:`plot_curves`, :func:`plot_final_vs_param`, :func:`write_report`,
:func:`run_frontier`."""

from tvq_exp.tools.analysis.cli import main
from tvq_exp.tools.analysis.frontier import frontier_overrides, frontier_report, run_frontier
from tvq_exp.tools.analysis.plots import plot_curves, plot_final_vs_param
from tvq_exp.tools.analysis.report import markdown_table, write_report
from tvq_exp.tools.analysis.runs import find_runs, latest_sweep, load_scalars, load_sweep, read_overrides

__all__ = [
    "find_runs",
    "frontier_overrides",
    "frontier_report",
    "latest_sweep",
    "load_scalars",
    "load_sweep",
    "main",
    "markdown_table",
    "plot_curves",
    "plot_final_vs_param",
    "read_overrides",
    "run_frontier",
    "write_report",
]

if __name__ == "__main__":
    main()
