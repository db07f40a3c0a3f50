"""The quality–speed frontier: each backend trained for a fixed wall-clock budget at equal size on the
Gutenberg books (CPU), then validation bits/byte plotted against training time. The model size and the
per-backend settings are data, in ``conf/frontier.yaml``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import yaml

from tvq_exp.files import write_text
from tvq_exp.tools.analysis.plots import plot_curves, save
from tvq_exp.tools.analysis.report import markdown_table
from tvq_exp.tools.analysis.runs import load_sweep

REPO = Path(__file__).resolve().parents[3]
FRONTIER_CONFIG = REPO / "conf" / "frontier.yaml"


def frontier_config() -> dict:
    """``conf/frontier.yaml``: ``models`` (the default backends), ``size`` (overrides every model gets) and
    ``per_model`` (extra overrides of one model)."""
    return yaml.safe_load(FRONTIER_CONFIG.read_text())


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
        *frontier_config()["size"],
        *(frontier_config()["per_model"].get(model) or ()),
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
    models: Sequence[str] | None = None,
    budget_s: float = 120.0,
    extra: Sequence[str] = (),
) -> pd.DataFrame:
    """Train each model for ``budget_s`` seconds, one after the other (``<out>/runs/<model>``), then write
    ``<out>/frontier.md`` (command, table) and ``<out>/frontier.png`` (val bits/byte vs training time)."""
    out = Path(out).resolve()
    models = list(models or frontier_config()["models"])
    for model in models:
        command = [
            sys.executable,
            str(REPO / "train.py"),
            *frontier_overrides(model, budget_s, out / "runs" / model, extra),
        ]
        subprocess.run(command, check=True, cwd=REPO, env=os.environ.copy())
    return frontier_report(out, models, budget_s, extra)


def frontier_report(
    out: str | Path, models: Sequence[str], budget_s: float, extra: Sequence[str] = ()
) -> pd.DataFrame:
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
        f"({', '.join(frontier_config()['size'])}); validation on the first 4 batches every 20 steps.",
        "",
        "```bash",
        command,
        "```",
        "",
        markdown_table(table[[c for c in columns if c in table.columns]]),
        "",
        "![frontier](frontier.png)",
    ]
    return write_text("frontier.md", out, "\n".join(lines) + "\n")
