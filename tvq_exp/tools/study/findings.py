"""The README's findings table, made from the studies' result files (``studies/*/results/``) alone.

``studies/findings.yaml`` lists the findings: each a question, a link to the page with the details, and a sentence
whose ``{name}`` fields are quantities of the result files: a metric (``bpb``, ``accuracy.accuracy``) of one
evaluation of one (study, run, regime), its mean over seeds ± half their range, or (``minus: EVALUATION``) the
per-seed difference between two evaluations of the same weights. A row's seeds cell is the number of seeds
of its quantities (``1–3``: they differ; a value without ``±`` is one seed's).

``python -m tvq_exp.tools.study.findings`` prints the table; ``--write README.md`` puts it between the file's
``<!-- findings: begin -->`` and ``<!-- findings: end -->`` lines (tests/tools/test_findings.py checks that the
README holds what the result files give).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tvq_exp.tools.study.report import replace_between
from tvq_exp.tools.study.results import load_results, mean_and_spread

REPO = Path(__file__).resolve().parents[3]
SPEC = REPO / "studies" / "findings.yaml"
BEGIN, END = "<!-- findings: begin -->", "<!-- findings: end -->"


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A metric of one evaluation of one (study, run, regime), per seed; ``minus``: less that of another
    evaluation of the same checkpoint (a paired difference)."""

    study: str
    run: str
    regime: str
    evaluation: str
    metric: str = "bpb"
    minus: str | None = None
    digits: int = 3

    def per_seed(self, studies: Path) -> dict[int, float]:
        """``{seed: value}`` from ``<studies>/<study>/results/``; a name no result file has is refused in one
        line."""
        results = [
            r
            for r in load_results(studies / self.study)
            if (r["run"], r["regime"]) == (self.run, self.regime)
        ]
        if not results:
            raise ValueError(f"{self.study}: no result of run {self.run!r}, regime {self.regime!r}")
        values = {}
        for result in results:
            evaluations = result["evaluations"]
            for name in filter(None, (self.evaluation, self.minus)):
                if name not in evaluations:
                    raise ValueError(f"{result['id']}: no evaluation {name!r} (it has {sorted(evaluations)})")
            value = metric(evaluations[self.evaluation], self.metric)
            if self.minus is not None:
                value -= metric(evaluations[self.minus], self.metric)
            values[int(result["seed"])] = value
        return values


def metric(evaluation: Mapping[str, Any], path: str) -> float:
    """``evaluation``'s value at the dotted ``path`` (``accuracy.accuracy``)."""
    value: Any = evaluation
    for key in path.split("."):
        value = value[key]
    return float(value)


def formatted(values: Sequence[float], digits: int, signed: bool) -> str:
    """``2.783 ± 0.017`` (the value alone for one seed); ``signed``: ``+0.0007``."""
    mean, spread = mean_and_spread(values)
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text if len(values) == 1 else f"{text} ± {spread:.{digits}f}"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One row: the question, the sentence with its ``{name}`` quantities, the page with the details."""

    question: str
    finding: str
    quantities: Mapping[str, Quantity]
    link: str

    def row(self, studies: Path) -> str:
        """The Markdown row: question | finding (quantities filled in) | seeds | link."""
        per_seed = {name: q.per_seed(studies) for name, q in self.quantities.items()}
        text = self.finding.format(
            **{
                name: formatted(list(per_seed[name].values()), q.digits, signed=q.minus is not None)
                for name, q in self.quantities.items()
            }
        )
        counts = sorted({len(values) for values in per_seed.values()})
        seeds_cell = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        return f"| {self.question} | {' '.join(text.split())} | {seeds_cell} | [{Path(self.link).stem}]({self.link}) |"


def load_findings(path: Path = SPEC) -> list[Finding]:
    """The findings of a findings file (``studies/findings.yaml``); a quantity the sentence does not use, or a
    field without a quantity, is refused in one line."""
    findings = []
    for entry in yaml.safe_load(path.read_text()):
        quantities = {name: Quantity(**fields) for name, fields in entry["quantities"].items()}
        used = set(re.findall(r"\{(\w+)\}", entry["finding"]))
        if used != set(quantities):
            raise ValueError(
                f"{path}: {entry['question']!r}: the sentence uses {sorted(used)}, the quantities are "
                f"{sorted(quantities)}"
            )
        findings.append(Finding(entry["question"], entry["finding"], quantities, entry["link"]))
    return findings


def findings_table(studies: Path = REPO / "studies", spec: Path = SPEC) -> str:
    """The Markdown table of every finding of ``spec`` from the result files under ``studies``."""
    lines = ["| question | finding | seeds | details |", "|---|---|---|---|"]
    return "\n".join(lines + [finding.row(studies) for finding in load_findings(spec)])


def with_table(text: str, table: str) -> str:
    """``text`` with ``table`` between its findings markers (one of each, in order, or a one-line error)."""
    return replace_between(text, "findings", table)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m tvq_exp.tools.study.findings [--write README.md]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tvq_exp.tools.study.findings", description="The findings table from the result files."
    )
    parser.add_argument("--write", default=None, help="put the table between this file's findings markers")
    args = parser.parse_args(argv)
    table = findings_table()
    if args.write is None:
        print(table)
        return
    target = Path(args.write)
    target.write_text(with_table(target.read_text(), table))
    print(f"wrote the findings table ({table.count(chr(10)) - 1} rows) into {target}")


__all__ = ["Finding", "Quantity", "findings_table", "load_findings", "main", "metric", "with_table"]

if __name__ == "__main__":
    main()
