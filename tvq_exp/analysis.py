"""Read runs' TensorBoard event files into pandas tables and draw comparison plots.

A *run* is a directory holding a Hydra ``.hydra/`` folder, a ``config.yaml`` or an ``error.txt``; a
*sweep* is any directory above runs (``logs/multiruns/<time>/``: one run per job). Commands::

    python -m tvq_exp.analysis SWEEP_DIR --out report/        # report/summary.md + PNG plots
    python -m tvq_exp.analysis frontier --budget 120 --out docs/frontier/
        # trains each backend at equal size on the Gutenberg books for a fixed wall-clock budget (CPU),
        # then plots validation bits/byte against training time (frontier.md + frontier.png)

In Python: :func:`load_sweep` (one row per run), :func:`load_scalars` (long table of every scalar),
:func:`plot_curves`, :func:`plot_final_vs_param`, :func:`write_report`, :func:`run_frontier`.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EVENT_GLOB = "events.out.tfevents.*"
ERROR_FILE = "error.txt"
SUMMARY_METRICS = ("val/bpb", "val/loss", "train/loss", "train/bpb", "throughput/tokens_per_s")
REPORT_METRICS = ("val/bpb", "train/loss")
LOWER_IS_BETTER_PREFIXES = ("val/", "train/")
REPO = Path(__file__).resolve().parents[1]
FRONTIER_MODELS = ("gau_dense", "gau_vq", "gau_linear", "gau_flash")
# Equal size for every backend: 4 GAUs, d_model 128, d_k 64 (VQ: S 256, L 64; FLASH: groups of 64).
FRONTIER_SIZE = ("model.d_model=128", "model.n_layers=4", "model.block.d_k=64")
FRONTIER_BACKEND = {
    "gau_vq": ("model.attention.codebook_size=256", "model.attention.block_len=64"),
    "gau_flash": ("model.attention.group_size=64",),
    "gau_dense": ("model.attention.window_len=256",),
}


# --------------------------------------------------------------------------------------------- reading


def latest_sweep(log_dir: str | Path = "logs") -> Path:
    """The newest sweep directory ``<log_dir>/multiruns/<time>_<id>`` (by name: names start with the time)."""
    sweeps = sorted(path for path in (Path(log_dir) / "multiruns").glob("*") if path.is_dir())
    if not sweeps:
        raise FileNotFoundError(
            f"no sweeps under {Path(log_dir) / 'multiruns'}: run `python train.py -m ...` first"
        )
    return sweeps[-1]


def is_run_dir(path: Path) -> bool:
    """A run directory: has ``.hydra/``, ``config.yaml`` or ``error.txt``."""
    return (path / ".hydra").is_dir() or (path / "config.yaml").is_file() or (path / ERROR_FILE).is_file()


def find_runs(sweep_dir: str | Path) -> list[Path]:
    """Every run directory at or below ``sweep_dir`` (runs do not nest), sorted naturally (job 2 before 10)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no such sweep directory: {root}")
    if is_run_dir(root):
        return [root]
    runs = [path for child in sorted(root.iterdir()) if child.is_dir() for path in find_runs(child)]
    return sorted(runs, key=_natural_key)


def _natural_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in path.parts)


def event_files(run_dir: Path) -> list[Path]:
    """The run's TensorBoard event files (any depth below the run directory)."""
    return sorted(run_dir.rglob(EVENT_GLOB))


def load_scalars(run_dir: str | Path) -> pd.DataFrame:
    """Every scalar of a run: columns ``tag, step, wall_time, value`` (``wall_time`` in seconds since epoch)."""
    rows = []
    for path in event_files(Path(run_dir)):
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            rows.extend((tag, e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag))
    frame = pd.DataFrame(rows, columns=["tag", "step", "wall_time", "value"])
    return frame.sort_values(["tag", "wall_time", "step"], ignore_index=True)


def read_overrides(run_dir: str | Path) -> dict[str, str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``) as ``{key: value}`` (Hydra's ``+``/``~``
    prefixes dropped). Empty when the run was not started by Hydra."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    overrides = yaml.safe_load(path.read_text()) or []
    pairs = (str(item).lstrip("+~").split("=", 1) for item in overrides)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def run_summary(run_dir: Path, scalars: pd.DataFrame) -> dict[str, object]:
    """One row: status, steps, wall time (first to last event), and final (last) and best value of each
    metric in ``SUMMARY_METRICS`` (best = the lowest, for ``train/`` and ``val/`` metrics)."""
    row: dict[str, object] = {
        "run": str(run_dir),
        "status": "failed" if (run_dir / ERROR_FILE).is_file() else "ok",
    }
    row["steps"] = int(scalars["step"].max()) if len(scalars) else 0
    row["wall_time_s"] = (
        float(scalars["wall_time"].max() - scalars["wall_time"].min()) if len(scalars) else math.nan
    )
    for metric in SUMMARY_METRICS:
        values = scalars.loc[scalars["tag"] == metric, "value"]
        row[f"final {metric}"] = float(values.iloc[-1]) if len(values) else math.nan
        if metric.startswith(LOWER_IS_BETTER_PREFIXES):
            row[f"best {metric}"] = float(values.min()) if len(values) else math.nan
    return row


def swept_keys(overrides: Sequence[dict[str, str]]) -> list[str]:
    """Override keys whose value differs between runs (all keys when there is a single run)."""
    keys = sorted({key for item in overrides for key in item})
    if len(overrides) <= 1:
        return keys
    return [key for key in keys if len({item.get(key) for item in overrides}) > 1]


def load_sweep(sweep_dir: str | Path) -> pd.DataFrame:
    """One row per run below ``sweep_dir``: ``run``, the swept overrides, ``status``, ``steps``,
    ``wall_time_s`` and ``final``/``best`` of each summary metric. ``df.attrs["swept"]`` lists the swept
    keys and ``df.attrs["scalars"]`` maps each run directory to its :func:`load_scalars` table."""
    runs = find_runs(sweep_dir)
    overrides = [read_overrides(run) for run in runs]
    swept = swept_keys(overrides)
    scalars = {str(run): load_scalars(run) for run in runs}
    rows = []
    for run, items in zip(runs, overrides, strict=True):
        summary = run_summary(run, scalars[str(run)])
        rows.append({"run": summary.pop("run"), **{key: items.get(key, "") for key in swept}, **summary})
    table = pd.DataFrame(rows)
    table.attrs["swept"] = swept
    table.attrs["scalars"] = scalars
    return table


# --------------------------------------------------------------------------------------------- plots


def run_label(table: pd.DataFrame, index: int) -> str:
    """``key=value`` of the swept keys (the run directory's name when nothing is swept)."""
    row = table.iloc[index]
    parts = [f"{key.split('.')[-1]}={row[key]}" for key in table.attrs.get("swept", [])]
    return ", ".join(parts) or Path(str(row["run"])).name


def plot_curves(table: pd.DataFrame, metric: str, x: str = "step", ax: Axes | None = None) -> Axes:
    """``metric`` of every run against ``x``: ``"step"`` or ``"wall_time"`` (seconds since the run's first event)."""
    if x not in ("step", "wall_time"):
        raise ValueError(f"x must be 'step' or 'wall_time', got {x!r}")
    ax = ax or plt.figure(figsize=(6, 4)).gca()
    for index, run in enumerate(table["run"]):
        scalars = table.attrs["scalars"][str(run)]
        start = scalars["wall_time"].min() if len(scalars) else 0.0
        curve = scalars[scalars["tag"] == metric]
        if len(curve):
            xs = curve["step"] if x == "step" else curve["wall_time"] - start
            ax.plot(xs, curve["value"], marker="o", markersize=3, label=run_label(table, index))
    ax.set_xlabel("step" if x == "step" else "wall time (s)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return ax


def plot_final_vs_param(
    table: pd.DataFrame, param: str, metric: str = "val/bpb", ax: Axes | None = None
) -> Axes:
    """The final value of ``metric`` against the swept ``param`` (numeric axis when every value is a number)."""
    ax = ax or plt.figure(figsize=(5, 4)).gca()
    data = table[[param, f"final {metric}"]].dropna()
    values = pd.to_numeric(data[param], errors="coerce")
    if values.notna().all() and len(values):
        order = values.argsort()
        ax.plot(values.iloc[order], data[f"final {metric}"].iloc[order], marker="o")
        if values.min() > 0 and values.max() / values.min() >= 8:
            ax.set_xscale("log", base=2)
    else:
        ax.bar(data[param].astype(str), data[f"final {metric}"])
    ax.set_xlabel(param)
    ax.set_ylabel(f"final {metric}")
    ax.grid(alpha=0.3)
    return ax


def save(figure: Figure, path: Path) -> Path:
    """Save ``figure`` as ``path`` (tight layout) and close it."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# --------------------------------------------------------------------------------------------- report


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
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return table


# --------------------------------------------------------------------------------------------- frontier


def max_time(seconds: int) -> str:
    """Lightning's ``max_time`` string ``DD:HH:MM:SS`` for ``seconds``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def frontier_overrides(model: str, budget_s: float, run_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """``train.py`` overrides for one backend of the frontier: random 256-byte windows of the Gutenberg
    books, equal model size, ``budget_s`` seconds of training (Lightning ``max_time``), frequent short
    validations.

    Every training window starts from an empty state, as every validation segment does. Carried
    streams (``data.sampler=stream``) would not be a fair protocol across backends: linear and FLASH
    attention normalise by the number of keys summed, which on a carried stream grows without bound,
    so a model trained that way meets a fresh state only at validation (measured: gau_flash's
    per-segment val/bpb rose from 4.2 to 12.9 while its training loss kept falling)."""
    seconds = max(1, int(round(budget_s)))
    return [
        f"model={model}",
        "data=gutenberg",
        "trainer=cpu",
        "data.seq_len=256",
        "data.batch_size=8",
        "data.eval_batch_size=32",
        "data.sampler=random",
        *FRONTIER_SIZE,
        *FRONTIER_BACKEND.get(model, ()),
        "trainer.max_steps=100000",
        f"+trainer.max_time='{max_time(seconds)}'",
        "trainer.val_check_interval=20",
        "trainer.limit_val_batches=4",
        "trainer.log_every_n_steps=10",
        "trainer.enable_progress_bar=false",
        "module.lr=2e-3",
        "module.warmup_steps=50",
        "module.max_steps=2000",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def run_frontier(
    out: str | Path,
    models: Sequence[str] = FRONTIER_MODELS,
    budget_s: float = 120.0,
    extra: Sequence[str] = (),
) -> pd.DataFrame:
    """Train each model for ``budget_s`` seconds, one after the other (``<out>/runs/<model>``), then write
    ``<out>/frontier.md`` (command, table) and ``<out>/frontier.png`` (val bits/byte vs training time)."""
    out = Path(out).resolve()
    for model in models:
        command = [
            sys.executable,
            str(REPO / "train.py"),
            *frontier_overrides(model, budget_s, out / "runs" / model, extra),
        ]
        subprocess.run(command, check=True, cwd=REPO, env=os.environ.copy())
    return frontier_report(out, models, budget_s, extra)


def frontier_report(out: str | Path, models: Sequence[str], budget_s: float, extra: Sequence[str] = ()) -> pd.DataFrame:
    """Read ``<out>/runs/<model>`` and write ``<out>/frontier.md`` and ``<out>/frontier.png``."""
    out = Path(out).resolve()
    table = load_sweep(out / "runs")
    table["model"] = [Path(str(run)).name for run in table["run"]]
    table.attrs["swept"] = ["model"]
    figure, ax = plt.subplots(figsize=(6, 4))
    plot_curves(table, "val/bpb", "wall_time", ax)
    ax.set_title(f"Gutenberg, {budget_s:.0f} s of CPU training per backend")
    save(figure, out / "frontier.png")
    write_frontier_markdown(table, out, models, budget_s, extra)
    return table


def write_frontier_markdown(
    table: pd.DataFrame, out: Path, models: Sequence[str], budget_s: float, extra: Sequence[str]
) -> Path:
    """``<out>/frontier.md``: the exact command, the table (final/best val bits/byte, steps, tokens/s), the plot."""
    command = (
        f"python -m tvq_exp.analysis frontier --models {','.join(models)} --budget {budget_s:g} --out {out}"
    )
    if extra:
        command += " " + " ".join(extra)
    columns = [
        "model",
        "steps",
        "wall_time_s",
        "final val/bpb",
        "best val/bpb",
        "final throughput/tokens_per_s",
    ]
    lines = [
        "## Quality–speed frontier (CPU)",
        "",
        f"Each backend trained for {budget_s:g} s on the Gutenberg books at equal size "
        f"({', '.join(FRONTIER_SIZE)}); validation on the first 4 batches every 20 steps.",
        "",
        "```bash",
        command,
        "```",
        "",
        markdown_table(table[[c for c in columns if c in table.columns]]),
        "",
        "![frontier](frontier.png)",
    ]
    path = out / "frontier.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------------------------- command line


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
    parser.add_argument("--models", default=",".join(FRONTIER_MODELS), help="comma-separated model configs")
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


if __name__ == "__main__":
    main()
