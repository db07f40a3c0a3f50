"""The README's findings table: made from the result files, so it cannot drift from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools.study.findings import BEGIN, END, Quantity, findings_table, load_findings, with_table


def test_the_readme_table_is_the_one_the_result_files_give() -> None:
    readme = (REPO / "README.md").read_text()
    assert with_table(readme, findings_table()) == readme, (
        "README.md's findings table differs from the result files: "
        "python -m tvq_exp.tools.study.findings --write README.md"
    )


def test_a_changed_result_changes_its_row(tmp_path: Path) -> None:
    """Every number comes from the files: move one seed's bits and the row's mean and spread move."""
    shutil.copytree(REPO / "studies", tmp_path / "studies", ignore=shutil.ignore_patterns("runs"))
    before = findings_table(tmp_path / "studies")
    path = tmp_path / "studies" / "long_context" / "results" / "gau_vq--tbptt--s1.json"
    result = json.loads(path.read_text())
    result["evaluations"]["sequence"]["bpb"] += 0.3
    path.write_text(json.dumps(result))
    after = findings_table(tmp_path / "studies")
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "2.782 ± 0.017" in changed[0][0] and "2.882 ± 0.167" in changed[0][1]
    assert (
        "by -0.0993 ± 0.1500" in changed[0][1]
    )  # the paired share moves with it (same seed, other evaluation)


def test_a_paired_quantity_is_the_per_seed_difference() -> None:
    share = Quantity("long_context", "gau_vq", "tbptt", "sequence_nocache", minus="sequence")
    values = share.per_seed(REPO / "studies")
    results = {
        s: json.loads((REPO / f"studies/long_context/results/gau_vq--tbptt--s{s}.json").read_text())[
            "evaluations"
        ]
        for s in (1, 2, 3)
    }
    assert values == {s: e["sequence_nocache"]["bpb"] - e["sequence"]["bpb"] for s, e in results.items()}


def test_a_quantity_naming_no_result_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^long_context: no result of run 'gau_vqq', regime 'tbptt'$"):
        Quantity("long_context", "gau_vqq", "tbptt", "sequence").per_seed(REPO / "studies")
    with pytest.raises(ValueError, match=r"gau_vq--tbptt--s1: no evaluation 'test' \(it has \['sequence'"):
        Quantity("long_context", "gau_vq", "tbptt", "test").per_seed(REPO / "studies")


def test_a_sentence_and_its_quantities_must_match(tmp_path: Path) -> None:
    spec = tmp_path / "findings.yaml"
    spec.write_text(
        "- {question: Why, finding: 'x {a} {b}', link: docs/recall.md, quantities: "
        "{a: {study: recall, run: dense, regime: mqar128, evaluation: test}}}\n"
    )
    with pytest.raises(ValueError, match=r"the sentence uses \['a', 'b'\], the quantities are \['a'\]"):
        load_findings(spec)


def test_the_table_goes_between_the_markers_only() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert with_table(text, "| t |") == f"head\n{BEGIN}\n| t |\n{END}\ntail\n"
    with pytest.raises(ValueError, match="expected one"):
        with_table("no markers", "| t |")
