"""A study's tables and plots, made from its result files alone.

For every (run, regime): the mean over seeds of bits per token, overall and per position bucket, with the
spread (``±`` half the range over seeds; the seeds are listed); a Markdown table per evaluation and a plot of
bits against position with one line per (run, regime). The study's comparisons (``compare``) pair two runs by
seed: the per-seed differences, their mean and standard deviation, the paired t and the seeds in which the first
run is ahead.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tvq_exp.files import atomic_write, make_dirs, write_text
from tvq_exp.plots import position_figure, save_figure
from tvq_exp.tools.study.health import health_section
from tvq_exp.tools.study.recall import accuracy_section, backend_label
from tvq_exp.tools.study.results import Group, cell, grouped, load_results
from tvq_exp.tools.study.spec import Comparison


def bucket_key(bucket: dict[str, Any]) -> str:
    return f"[{bucket['start']},{bucket['end']})"


def mean_buckets(evals: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bucket by bucket, the mean bits over seeds (buckets every seed has)."""
    keys = [bucket_key(b) for b in evals[0]["position_buckets"]]
    by_key = [{bucket_key(b): b for b in e["position_buckets"]} for e in evals]
    shared = [k for k in keys if all(k in b for b in by_key)]
    return [{**by_key[0][k], "bpb": statistics.fmean(b[k]["bpb"] for b in by_key)} for k in shared]


def table(groups: dict[Group, list[dict[str, Any]]]) -> str:
    """Markdown: one row per (run, regime): seeds, overall bits, bits per position bucket."""
    if not groups:
        return "(no results yet)"
    spans = {(b["start"], b["end"]) for evals in groups.values() for b in mean_buckets(evals)}
    buckets = [bucket_key({"start": a, "end": z}) for a, z in sorted(spans)]  # every run's (runs differ in L)
    header = ["run", "regime", "seeds", "all", *buckets]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for (run, regime), evals in groups.items():
        per_bucket = [
            [{bucket_key(b): b["bpb"] for b in e["position_buckets"]}.get(k) for e in evals] for k in buckets
        ]
        cells = [
            cell([v for v in values if v is not None]) if any(v is not None for v in values) else ""
            for values in per_bucket
        ]
        seeds = ",".join(str(e["seed"]) for e in evals)
        lines.append("| " + " | ".join([run, regime, seeds, cell([e["bpb"] for e in evals]), *cells]) + " |")
    return "\n".join(lines)


def replace_between(text: str, marker: str, content: str) -> str:
    """``text`` with ``content`` between its ``<!-- {marker}: begin -->`` and ``<!-- {marker}: end -->`` lines (one of
    each, in order; else a one-line :class:`ValueError`): a page's generated part, rewritten from the files."""
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} line, then one {end} line")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def into_page(report: Path, page: Path, figures: Path) -> Path:
    """Put ``report``'s body (all but its title) between ``page``'s ``report`` markers, its figure links made
    relative to the page's folder (the PNGs are in ``figures``); returns ``page``."""
    body = report.read_text().split("\n", 1)[1].strip()
    folder = Path(os.path.relpath(figures, page.parent))
    body = re.sub(r"(!\[[^\]]*\]\()([^)/]+\.png)\)", lambda m: f"{m[1]}{(folder / m[2]).as_posix()})", body)
    page.write_text(replace_between(page.read_text(), "report", body))
    return page


def write_report(
    out: Path, title: str, figures: Path | None = None, comparisons: Sequence[Comparison] = ()
) -> Path:
    """``<out>/report.md`` (a table per evaluation, then the ``comparisons``) and ``<figures or
    out>/<evaluation>.png`` (bits against position, one line per run and regime); returns the report's path."""
    results = load_results(out)
    shown, out = out, Path(os.path.abspath(out))  # a relative folder is the working directory's, not its own
    figures = make_dirs(os.path.abspath(figures or out), os.path.abspath(figures or out))
    names = sorted({name for r in results for name in r["evaluations"]})
    lines = [f"# {title}", "", f"{len(results)} jobs (`{shown}/results/*.json`).", ""]
    for name in names:
        groups = grouped(results, name)
        figure = position_figure(
            {f"{run} ({regime})": mean_buckets(evals) for (run, regime), evals in groups.items()}
        )
        with atomic_write(f"{name}.png", figures) as png:  # names checked plain (load_results): never outside
            save_figure(figure, png)
        lines += [f"## Evaluation `{name}`", ""]
        if any("accuracy" in e for evals in groups.values() for e in evals):
            labels = {r["run"]: backend_label(r["config"]) for r in results}
            lines += accuracy_section(name, groups, labels, figures)
        lines += health_section(groups)
        lines += [
            "Bits per token (mean over seeds ± half their range), overall and "
            "by position since the last state reset:",
            "",
            table(groups),
            "",
            f"![{name}]({name}.png)",
            "",
        ]
    first = names[0] if names else None
    for name in names[1:]:
        paired = paired_table(grouped(results, first), grouped(results, name))
        if paired:
            lines += [
                f"## `{name}` minus `{first}` on the same weights",
                "",
                "Per seed, the difference in bits per token between the two evaluations of the same checkpoint "
                "(mean over seeds ± half their range; positive: worse under "
                f"`{name}`):",
                "",
                paired,
                "",
            ]
    compared = comparison_table(grouped(results, first), comparisons) if first else ""
    if compared:
        lines += [
            f"## Runs compared, paired by seed (evaluation `{first}`)",
            "",
            "Per seed both runs have, the first run's figure minus the second's: accuracy where the evaluation has "
            "it, else bits per token (lower is better); their mean ± standard deviation, the paired t (the mean "
            "over its standard error; about 2.8 or more for p < 0.05 two-sided at 4 degrees of freedom, 2.4 at "
            "7), and in how many seeds the first run's figure is higher:",
            "",
            compared,
            "",
        ]
    return write_text("report.md", out, "\n".join(lines))


def comparison_table(groups: dict[Group, list[dict[str, Any]]], comparisons: Sequence[Comparison]) -> str:
    """Markdown: one row per comparison whose runs share a seed ("" when none does)."""
    rows = []
    for c in comparisons:
        mine = {e["seed"]: e for e in groups.get((c.run, c.regime), [])}
        theirs = {e["seed"]: e for e in groups.get((c.against, c.regime), [])}
        seeds = sorted(mine.keys() & theirs.keys())
        if not seeds:
            continue
        accuracy = all("accuracy" in mine[s] and "accuracy" in theirs[s] for s in seeds)
        figure = (lambda e: e["accuracy"]["accuracy"]) if accuracy else (lambda e: e["bpb"])
        diffs = [figure(mine[s]) - figure(theirs[s]) for s in seeds]
        mean = statistics.fmean(diffs)
        sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        t = f"{mean / (sd / len(diffs) ** 0.5):.2f}" if sd > 0 else ""
        rows.append(
            f"| {c.run} | {c.against} | {c.regime} | {'accuracy' if accuracy else 'bpb'} | "
            f"{','.join(map(str, seeds))} | {', '.join(f'{d:+.3f}' for d in diffs)} | {mean:+.4f} ± {sd:.4f} | "
            f"{t} | {sum(d > 0 for d in diffs)} of {len(diffs)} |"
        )
    if not rows:
        return ""
    header = "| run | against | regime | figure | seeds | per seed | mean ± sd | paired t | higher in |"
    return "\n".join([header, "|---|---|---|---|---|---|---|---|---|", *rows])


def paired_table(base: dict[Group, list[dict[str, Any]]], other: dict[Group, list[dict[str, Any]]]) -> str:
    """Markdown: per (run, regime) evaluated both ways, the per-seed differences ``other - base``, overall and
    per position bucket ("" when no run has both)."""
    rows = []
    for key, evals in other.items():
        by_seed = {e["seed"]: e for e in base.get(key, [])}
        pairs = [(by_seed[e["seed"]], e) for e in evals if e["seed"] in by_seed]
        if not pairs:
            continue
        buckets = [bucket_key(b) for b in pairs[0][0]["position_buckets"]]
        cells = [cell([o["bpb"] - b["bpb"] for b, o in pairs], signed=True)]
        for k in buckets:
            diffs = [
                {bucket_key(x): x["bpb"] for x in o["position_buckets"]}[k]
                - {bucket_key(x): x["bpb"] for x in b["position_buckets"]}[k]
                for b, o in pairs
            ]
            cells.append(cell(diffs, signed=True))
        rows.append((key, [str(s) for s in sorted(by_seed)], buckets, cells))
    if not rows:
        return ""
    header = ["run", "regime", "seeds", "all", *rows[0][2]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for (run, regime), seeds, _, cells in rows:
        lines.append("| " + " | ".join([run, regime, ",".join(seeds), *cells]) + " |")
    return "\n".join(lines)


__all__ = ["comparison_table", "mean_buckets", "paired_table", "table", "write_report"]
