"""The accuracy part of a study's report (the synthetic probes, docs/recall.md): a table of accuracy per run with
its recurrent state size and per answer bucket, accuracy against state size with one curve per backend (the
Zoology figure), and a heatmap per run for grid-shaped buckets (passkey: context length x depth).

Everything comes from the result files: the accuracy from ``eval.py``'s JSON (``accuracy``), the state size from
the same JSON (``state_floats_per_layer``), the backend from the run's stored config.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tvq_exp.files import atomic_write
from tvq_exp.plots import heatmap_figure, save_figure, state_figure
from tvq_exp.tools.study.results import Group, cell, mean_and_spread

GRID_BUCKET = re.compile(r"len_(\d+)_depth_([\d.]+)")


def backend_label(config: Mapping[str, Any]) -> str:
    """The curve a run belongs to: its attention backend (``vq``, ``dense``, ...), ``vq (no cache)`` when the
    cache is off."""
    attention = config.get("model", {}).get("attention", {})
    label = str(attention.get("name", "?"))
    return f"{label} (no cache)" if attention.get("use_cache") is False else label


def bucket_accuracy(evals: Sequence[dict[str, Any]], key: str = "accuracy") -> dict[str, list[float]]:
    """Bucket name -> its ``key`` (``accuracy``, or ``bpb``: bits per answer token) in every seed that has
    answers there (and reports ``key``)."""
    found: dict[str, list[float]] = {}
    for e in evals:
        for b in e["accuracy"]["buckets"]:
            if b["count"] and key in b:
                found.setdefault(b["name"], []).append(b[key])
    return found


def accuracy_table(groups: Mapping[Group, Sequence[dict[str, Any]]], key: str = "accuracy") -> str:
    """Markdown: one row per (run, regime): seeds, state floats per layer, the overall accuracy (or bits per
    answer token, ``key="bpb"``), the same per bucket."""
    buckets = list(dict.fromkeys(name for evals in groups.values() for name in bucket_accuracy(evals, key)))
    overall = {"accuracy": lambda e: e["accuracy"]["accuracy"], "bpb": lambda e: e["bpb"]}[key]
    header = ["run", "regime", "seeds", "state floats", key, *buckets]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for (run, regime), evals in groups.items():
        per_bucket = bucket_accuracy(evals, key)
        row = [
            run, regime, ",".join(str(e["seed"]) for e in evals), str(evals[0].get("state_floats_per_layer", "")),
            cell([overall(e) for e in evals]),
            *(cell(per_bucket[name]) if name in per_bucket else "" for name in buckets),
        ]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def state_curves(
    groups: Mapping[Group, Sequence[dict[str, Any]]], labels: Mapping[str, str]
) -> dict[str, list[tuple[float, float, float]]]:
    """Backend -> ``(state floats, mean accuracy, spread)`` per (run, regime) with a known state size."""
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for (run, regime), evals in groups.items():
        if "state_floats_per_layer" not in evals[0]:
            continue
        mean, spread = mean_and_spread([e["accuracy"]["accuracy"] for e in evals])
        label = labels[run] if len(regimes(groups)) == 1 else f"{labels[run]}, {regime}"
        curves.setdefault(label, []).append((float(evals[0]["state_floats_per_layer"]), mean, spread))
    return curves


def regimes(groups: Mapping[Group, Any]) -> set[str]:
    return {regime for _, regime in groups}


def grid(evals: Sequence[dict[str, Any]]) -> tuple[list[list[float]], list[str], list[str]] | None:
    """Mean accuracy over seeds on the (length x depth) grid of passkey-like buckets; ``None`` for others."""
    cells = {}
    for name, values in bucket_accuracy(evals).items():
        match = GRID_BUCKET.fullmatch(name)
        if match is None:
            return None
        cells[match.group(1), match.group(2)] = statistics.fmean(values)
    if not cells:
        return None
    lengths = sorted({k[0] for k in cells}, key=int)
    depths = sorted({k[1] for k in cells}, key=float)
    values = [[cells.get((length, depth), float("nan")) for depth in depths] for length in lengths]
    return values, [f"T={length}" for length in lengths], [f"{float(depth):.2f}" for depth in depths]


def accuracy_section(
    name: str, groups: Mapping[Group, Sequence[dict[str, Any]]], labels: Mapping[str, str], figures: Path
) -> list[str]:
    """The report's lines for an evaluation with accuracies (figures written to ``figures``)."""
    lines = [
        "Accuracy at answer positions (mean over seeds ± half their range), overall and per answer bucket; "
        "state floats: the recurrent inference state per layer and sequence at the evaluated length:",
        "",
        accuracy_table(groups),
        "",
    ]
    if any(bucket_accuracy(evals, "bpb") for evals in groups.values()):
        lines += [
            "Bits per answer token (mean over seeds ± half their range), overall and per answer bucket:",
            "",
            accuracy_table(groups, "bpb"),
            "",
        ]
    curves = state_curves(groups, labels)
    if curves:
        with atomic_write(f"{name}-accuracy-vs-state.png", figures) as png:  # never outside figures/
            save_figure(state_figure(curves), png)
        lines += [f"![accuracy against state size]({name}-accuracy-vs-state.png)", ""]
    for (run, regime), evals in groups.items():
        shaped = grid(evals)
        if shaped is not None:
            figure = heatmap_figure(
                *shaped, title=f"{run} ({regime}): accuracy, length x depth", xlabel="depth"
            )
            with atomic_write(f"{name}-{run}-{regime}-heatmap.png", figures) as png:
                save_figure(figure, png)
            lines += [f"![{run} heatmap]({name}-{run}-{regime}-heatmap.png)", ""]
    return lines


__all__ = ["accuracy_section", "accuracy_table", "backend_label", "grid", "state_curves"]
