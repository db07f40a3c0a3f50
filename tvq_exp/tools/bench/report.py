"""Benchmark records as a text table and a log-log plot."""

from __future__ import annotations

from typing import IO, Any


def _fmt(value: Any, spec: str) -> str:
    return format("-", ">" + spec.split(".")[0]) if value is None else format(value, spec)


def row(rec: dict[str, Any]) -> str:
    head = f"{rec['backend']:>12} {rec['mode']:>7} {rec['seq_len']:>7}"
    if "error" in rec:
        return f"{head}  {rec['error']}"
    cols = (
        _fmt(rec.get("ms"), "10.1f"), _fmt(rec.get("ms_min"), "10.1f"), _fmt(rec.get("tokens_per_s"), "12.0f"),
        _fmt(rec.get("peak_mem_mb"), "10.1f"), _fmt(rec.get("gflops_per_s"), "8.1f"), _fmt(rec.get("mm_fraction"), "6.2f"),
    )  # fmt: skip
    return f"{head} " + " ".join(cols) + f"  (reps {rec.get('reps')})"


def print_table(records: list[dict[str, Any]]) -> None:
    """The records as an aligned text table."""
    print(
        f"{'backend':>12} {'mode':>7} {'T':>7} {'ms(med)':>10} {'ms(min)':>10} {'tokens/s':>12} {'peak MB':>10} {'GFLOP/s':>8} {'mm%':>6}"
    )
    for rec in records:
        print(row(rec))


def plot(records: list[dict[str, Any]], path: str | IO[bytes], kind: str) -> None:
    """Log–log plot: time (attention) or tokens/s (model) and peak memory against length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    speed_key, speed_label = (
        ("ms", "time per call (ms)") if kind == "attention" else ("tokens_per_s", "tokens/s")
    )
    for (name, mode), recs in _group(records).items():
        ok = [r for r in recs if r.get("ms") is not None]
        label = name if (kind, mode) == ("model", "train") else f"{name} {mode}"
        for ax, key in zip(axes, (speed_key, "peak_mem_mb"), strict=True):
            ax.plot([r["seq_len"] for r in ok], [max(r[key], 1e-3) for r in ok], marker="o", label=label)
    for ax, ylabel in zip(axes, (speed_label, "peak memory (MB)"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def _group(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec["backend"], rec["mode"]), []).append(rec)
    return groups
