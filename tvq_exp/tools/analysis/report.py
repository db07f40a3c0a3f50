"""A sweep's report: ``summary.md`` (the run table) and its plots."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from tvq_exp.files import make_dirs, write_text
from tvq_exp.tools.analysis.plots import plot_curves, plot_final_vs_param, save
from tvq_exp.tools.analysis.runs import load_sweep

REPORT_METRICS = ("val/bpb", "train/loss")


def markdown_table(table: pd.DataFrame) -> str:
    """``table`` in Markdown (run directories shortened to their last two parts, all-NaN columns dropped)."""
    shown = table.copy()
    if "run" in shown.columns:
        shown["run"] = [str(Path(*Path(str(run)).parts[-2:])) for run in shown["run"]]
    columns = [c for c in shown.columns if not shown[c].isna().all()]
    shown = shown[columns]
    header = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(value) for value in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _slug(name: str) -> str:
    return name.replace("/", "_").replace(".", "_")


def write_report(sweep_dir: str | Path, out: str | Path) -> pd.DataFrame:
    """Write ``<out>/summary.md`` (the run table and links to the plots) and PNGs: each metric of
    ``REPORT_METRICS`` against step and wall time, and the final val/bpb against each swept key."""
    out = make_dirs(out, out)
    table = load_sweep(sweep_dir)
    plots = []
    for metric in REPORT_METRICS:
        for x in ("step", "wall_time"):
            plots.append(save(plot_curves(table, metric, x).figure, out / f"{_slug(metric)}_vs_{x}.png"))
    for param in table.attrs["swept"] if len(table) > 1 else []:
        if table["final val/bpb"].notna().any():
            plots.append(
                save(plot_final_vs_param(table, param).figure, out / f"final_val_bpb_vs_{_slug(param)}.png")
            )
    lines = [
        f"# Sweep {Path(sweep_dir)}",
        "",
        f"{len(table)} runs; swept: {', '.join(table.attrs['swept']) or '-'}",
        "",
    ]
    lines += [markdown_table(table), ""]
    lines += [f"![{path.stem}]({path.name})" for path in plots]
    write_text("summary.md", out, "\n".join(lines) + "\n")
    return table
