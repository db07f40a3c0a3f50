"""The codebook part of a study's report (docs/codebooks.md): per run and layer, the codebook's health over the
evaluated split's keys, from ``eval.py``'s JSON (``codebook``: per layer ``perplexity`` (usage perplexity, in
codes), ``dead_fraction``, ``quant_error``, ``regret`` (quantisation error relative to a fresh k-means on the
same keys) and ``kmeans_perplexity`` (that k-means' usage perplexity; absent from evaluations before 2026-11-26));
see :class:`~tvq_exp.callbacks.codebook_health.CodebookHealth`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tvq_exp.quantize.health import REGRET_FLOOR
from tvq_exp.tools.study.results import Group, cell


def layers(groups: Mapping[Group, Sequence[dict[str, Any]]]) -> list[str]:
    """The codebook layers any evaluation reports, in layer order (``layer0``, ``layer1``, ...)."""
    names = {name for evals in groups.values() for e in evals for name in e.get("codebook", {})}
    return sorted(names, key=lambda name: int(name.removeprefix("layer")))


def regret(health: dict[str, Any]) -> float:
    """The regret from a layer's stored errors, its reference floored at
    :data:`~tvq_exp.quantize.health.REGRET_FLOOR` (result files written before the floor hold the bare ratio)."""
    return health["quant_error"] / max(health["kmeans_error"], REGRET_FLOOR)


def has_reference(groups: Mapping[Group, Sequence[dict[str, Any]]]) -> bool:
    """Whether any evaluation reports the k-means' usage perplexity (those from before 2026-11-26 do not)."""
    return any(
        "kmeans_perplexity" in h
        for evals in groups.values()
        for e in evals
        for h in e.get("codebook", {}).values()
    )


def health_cells(evals: Sequence[dict[str, Any]], layer: str, reference: bool) -> list[str]:
    """``[usage perplexity, (k-means' usage perplexity,) dead fraction, regret]`` of ``layer`` over the seeds that
    report it, the k-means' usage with ``reference`` (over the seeds whose evaluation has it; "" when none has)."""
    found = [e["codebook"][layer] for e in evals if layer in e.get("codebook", {})]
    if not found:
        return []
    size = found[0]["codebook_size"]
    kmeans = [h["kmeans_perplexity"] for h in found if "kmeans_perplexity" in h]
    return [
        f"{cell([h['perplexity'] for h in found])} / {size}",
        *([f"{cell(kmeans)} / {size}" if kmeans else ""] if reference else []),
        cell([h["dead_fraction"] for h in found]),
        cell([regret(h) for h in found]),
    ]


def health_table(groups: Mapping[Group, Sequence[dict[str, Any]]]) -> str:
    """Markdown: one row per (run, regime, layer): usage perplexity / S, the k-means' usage perplexity / S (when
    some evaluation reports it), dead fraction, regret ("" when no evaluation reports a codebook)."""
    names = layers(groups)
    if not names:
        return ""
    reference = has_reference(groups)
    header = ["run", "regime", "seeds", "layer", "usage perplexity / S",
              *(["k-means usage / S"] if reference else []), "dead fraction", "regret"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for (run, regime), evals in groups.items():
        seeds = ",".join(str(e["seed"]) for e in evals)
        for layer in names:
            cells = health_cells(evals, layer, reference)
            if cells:
                lines.append("| " + " | ".join([run, regime, seeds, layer, *cells]) + " |")
    return "\n".join(lines)


def health_section(groups: Mapping[Group, Sequence[dict[str, Any]]]) -> list[str]:
    """The report's lines on codebook health for one evaluation ([] when it reports none)."""
    table = health_table(groups)
    if not table:
        return []
    reference = (
        " that of a fresh k-means with S codes on the same keys (what a codebook that minimises the quantisation "
        "error uses there; blank where the evaluation predates it),"
        if has_reference(groups)
        else ""
    )
    return [
        "Codebook health over the evaluated keys, per layer (mean over seeds ± half their range): usage "
        f"perplexity (the effective number of codes used) of S,{reference} the fraction of codes no key picks, "
        "and the regret (quantisation error / a fresh k-means' error on the same keys; 1 is as good as k-means):",
        "",
        table,
        "",
    ]


__all__ = ["health_section", "health_table", "layers"]
