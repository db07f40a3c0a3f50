"""Studies: the study file's jobs, the report's tables and figures from result files, and one real study run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools.study.recall import accuracy_table, backend_label, grid, state_curves
from tvq_exp.tools.study.report import write_report
from tvq_exp.tools.study.results import cell, grouped, load_results
from tvq_exp.tools.study.spec import Comparison, load_study


def _result(
    run: str, seed: int, bpb: float, accuracy: dict[str, Any] | None = None, **attention: Any
) -> dict:
    evaluation: dict[str, Any] = {
        "bpb": bpb,
        "position_buckets": [{"start": 0, "end": 16, "bpb": bpb + 0.1}, {"start": 16, "end": 32, "bpb": bpb}],
        "state_floats_per_layer": 1000 * (1 + len(run)),
    }
    if accuracy is not None:
        evaluation["accuracy"] = accuracy
    config = {"model": {"attention": {"name": run.split("_")[0], **attention}}}
    return {"run": run, "regime": "r", "seed": seed, "id": f"{run}--r--s{seed}", "config": config,
            "evaluations": {"test": evaluation}}  # fmt: skip


def _accuracy(overall: float, buckets: dict[str, float]) -> dict[str, Any]:
    return {
        "accuracy": overall,
        "sequence_accuracy": overall,
        "buckets": [
            {"name": k, "accuracy": v, "sequence_accuracy": v, "count": 10, "bpb": 2 - v}
            for k, v in buckets.items()
        ],
    }


def _write(out: Path, results: list[dict]) -> None:
    (out / "results").mkdir(parents=True)
    for r in results:
        (out / "results" / f"{r['id']}.json").write_text(json.dumps(r))


def test_the_study_files_expand_to_their_jobs() -> None:
    study = load_study(REPO / "conf/study/long_context.yaml")
    ids = {job.id for job in study.jobs}
    assert {"gau_vq--tbptt--s3", "gau_dense--random--s1", "gau_vq_s64--tbptt--s1"} <= ids
    assert "gau_vq_s64--random--s1" not in ids  # runs limited to the tbptt regime
    job = next(job for job in study.jobs if job.id == "gau_vq_nocache_official--random--s2")
    assert job.overrides[0] == "experiment=longctx_cpu" and "data.sampler=random" in job.overrides
    assert job.overrides[-1] == "model.attention.use_cache=false"  # the run's own overrides come last
    recall = load_study(REPO / "conf/study/recall.yaml")
    assert sum(job.run == "dense" for job in recall.jobs) == 3


def test_a_study_file_with_an_unknown_regime_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nregimes: {a: []}\nruns: {x: {regimes: [b]}}\nevaluate: []\n")
    with pytest.raises(ValueError, match="unknown regimes"):
        load_study(path)


def test_cells_report_the_mean_and_half_the_range() -> None:
    assert cell([2.0, 2.2, 2.1]) == "2.1000 ± 0.1000"
    assert cell([2.0]) == "2.0000"


def test_report_tables_and_figures_come_from_the_result_files(tmp_path: Path) -> None:
    _write(tmp_path, [_result("vq", 1, 2.0), _result("vq", 2, 2.2), _result("dense", 1, 1.5)])
    report = write_report(tmp_path, "Study t").read_text()
    assert "| vq | r | 1,2 | 2.1000 ± 0.1000 | 2.2000 ± 0.1000 | 2.1000 ± 0.1000 |" in report
    assert "| dense | r | 1 | 1.5000 | 1.6000 | 1.5000 |" in report
    assert (tmp_path / "test.png").read_bytes()[:4] == b"\x89PNG"
    assert "accuracy" not in report.lower().split("bits per token")[0]  # no accuracy section for bits only


def test_the_bits_table_has_a_column_for_every_runs_buckets(tmp_path: Path) -> None:
    whole = _result("dense", 1, 1.5)  # one bucket over the whole sequence, listed first
    whole["evaluations"]["test"]["position_buckets"] = [{"start": 0, "end": 128, "bpb": 1.5}]
    _write(tmp_path, [whole, _result("vq", 1, 2.0)])
    report = write_report(tmp_path, "Study t").read_text()
    assert "| run | regime | seeds | all | [0,16) | [0,128) | [16,32) |" in report
    assert "| dense | r | 1 | 1.5000 |  | 1.5000 |  |" in report
    assert "| vq | r | 1 | 2.0000 | 2.1000 |  | 2.0000 |" in report


def test_accuracy_table_state_curves_and_heatmaps(tmp_path: Path) -> None:
    gaps = {"gap_1_8": 1.0, "gap_8_64": 0.5}
    results = [
        _result("vq_s64", 1, 1.0, _accuracy(0.6, gaps)),
        _result("vq_s64", 2, 1.0, _accuracy(0.8, gaps)),
        _result("vq_s64_nocache", 1, 1.0, _accuracy(0.2, {"gap_1_8": 1.0}), use_cache=False),
        _result("dense", 1, 1.0, _accuracy(1.0, gaps)),
    ]
    _write(tmp_path, results)
    groups = grouped(load_results(tmp_path), "test")
    table = accuracy_table(groups)
    assert "| vq_s64 | r | 1,2 | 7000 | 0.7000 ± 0.1000 | 1.0000 ± 0.0000 | 0.5000 ± 0.0000 |" in table
    assert "| vq_s64_nocache | r | 1 | 15000 | 0.2000 | 1.0000 |  |" in table  # no answers there: empty
    bits = accuracy_table(groups, "bpb")  # bits per answer token, overall and per bucket
    assert "| vq_s64 | r | 1,2 | 7000 | 1.0000 ± 0.0000 | 1.0000 ± 0.0000 | 1.5000 ± 0.0000 |" in bits
    labels = {r["run"]: backend_label(r["config"]) for r in results}
    assert labels["vq_s64_nocache"] == "vq (no cache)"
    curves = state_curves(groups, labels)
    assert curves["vq"] == [(7000.0, pytest.approx(0.7), pytest.approx(0.1))]
    assert set(curves) == {"vq", "vq (no cache)", "dense"}
    assert grid(groups["vq_s64", "r"]) is None  # gap buckets are not a grid
    passkey = [{"seed": 1, "accuracy": _accuracy(0.5, {
        "len_256_depth_0.00": 1.0, "len_256_depth_1.00": 0.0, "len_512_depth_0.00": 0.5, "len_512_depth_1.00": 0.25,
    })}]  # fmt: skip
    values, rows, columns = grid(passkey)
    assert rows == ["T=256", "T=512"] and columns == ["0.00", "1.00"]
    assert values == [[1.0, 0.0], [0.5, 0.25]]
    report = write_report(tmp_path, "Study t").read_text()
    assert "![accuracy against state size](test-accuracy-vs-state.png)" in report
    assert "Bits per answer token" in report and bits in report
    assert (tmp_path / "test-accuracy-vs-state.png").is_file()


def test_a_tiny_study_runs_resumably_and_reports(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(
        "name: tiny\nbase: [experiment=smoke, trainer.max_steps=4, trainer.val_check_interval=4, data=mqar,"
        " data.seq_len=32, data.task.num_kv_pairs=2, data.vocab_size=64, data.num_val_examples=16,"
        " data.num_test_examples=16, model.attention.block_len=8]\n"
        "runs:\n  vq: {overrides: [model.attention.codebook_size=4], seeds: [1, 2]}\n"
        "evaluate:\n  - {name: test, split: test}\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        "-m",
        "tvq_exp.analysis",
        "study",
        "run",
        str(study),
        "--out",
        str(tmp_path / "s"),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = load_results(tmp_path / "s")
    assert [r["id"] for r in results] == ["vq--default--s1", "vq--default--s2"]
    evaluation = results[0]["evaluations"]["test"]
    assert evaluation["split"] == "test" and 0.0 <= evaluation["accuracy"]["accuracy"] <= 1.0
    assert evaluation["state_floats_per_layer"] > 0 and results[0]["train"]["global_step"] == 4
    first = (tmp_path / "s/results/vq--default--s1.json").stat().st_mtime_ns
    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (tmp_path / "s/results/vq--default--s1.json").stat().st_mtime_ns == first


def test_paired_differences_of_two_evaluations_of_the_same_weights(tmp_path: Path) -> None:
    results = []
    for seed, (on, off) in enumerate([(2.0, 2.1), (2.2, 2.4)], start=1):
        r = _result("vq", seed, on)
        r["evaluations"]["test_nocache"] = {**r["evaluations"]["test"], "bpb": off}
        r["evaluations"]["test_nocache"]["position_buckets"] = [
            {"start": 0, "end": 16, "bpb": on + 0.1}, {"start": 16, "end": 32, "bpb": off}
        ]  # fmt: skip
        results.append(r)
    _write(tmp_path, results)
    report = write_report(tmp_path, "Study t").read_text()
    assert "## `test_nocache` minus `test` on the same weights" in report
    assert "| vq | r | 1,2 | +0.1500 ± 0.0500 | +0.0000 ± 0.0000 | +0.1500 ± 0.0500 |" in report


def test_an_evaluation_can_apply_to_some_regimes_only(tmp_path: Path) -> None:
    """The codebook study crosses its runs with two tasks (regimes); each task's evaluation scores its own jobs."""
    study = load_study(REPO / "conf/study/codebooks.yaml")
    by_name = {e.name: e for e in study.evaluations}
    mqar = next(job for job in study.jobs if job.id == "healthy--mqar--s1")
    lm = next(job for job in study.jobs if job.id == "healthy--lm--s1")
    assert by_name["test"].applies_to(mqar) and not by_name["test"].applies_to(lm)
    assert by_name["sequence_nocache"].applies_to(lm) and not by_name["sequence_nocache"].applies_to(mqar)
    assert "experiment=recall_cpu" in mqar.overrides and "codebook=healthy" in mqar.overrides
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nregimes: {a: []}\nruns: {x: {}}\nevaluate: [{name: e, regimes: [b]}]\n")
    with pytest.raises(ValueError, match=r"evaluate.e.regimes names unknown regimes \['b'\]"):
        load_study(path)


def test_the_report_has_each_layers_codebook_health(tmp_path: Path) -> None:
    results = []
    for seed, (ppl, regret) in enumerate([(30.0, 1.5), (34.0, 2.5)], start=1):
        r = _result("vq", seed, 2.0)
        r["evaluations"]["test"]["codebook"] = {
            f"layer{i}": {"perplexity": ppl + i, "dead_fraction": 0.25, "quant_error": 0.1 * regret,
                          "kmeans_error": 0.1, "regret": regret, "kmeans_perplexity": 40.0 + 2 * seed + i,
                          "codebook_size": 64}
            for i in (0, 1)
        }  # fmt: skip
        results.append(r)
    # a file from before the regret's floor (the ratio is recomputed with it) and the k-means' usage (left blank)
    old = _result("vq", 3, 2.0)
    old["evaluations"]["test"]["codebook"] = {
        "layer0": {
            "perplexity": 19.0,
            "dead_fraction": 0.5,
            "quant_error": 0.03,
            "kmeans_error": 1e-9,
            "regret": 3e7,
            "codebook_size": 256,
        }
    }
    old["run"], old["id"] = "old", "old--r--s3"
    results += [old, _result("dense", 1, 2.5)]  # dense: no codebook, no health row
    _write(tmp_path, results)
    report = write_report(tmp_path, "Study t").read_text()
    assert (
        "| vq | r | 1,2 | layer0 | 32.0000 ± 2.0000 / 64 | 43.0000 ± 1.0000 / 64 | 0.2500 ± 0.0000 | 2.0000 ± 0.5000 |"
        in report
    )
    assert "| vq | r | 1,2 | layer1 | 33.0000 ± 2.0000 / 64 | 44.0000 ± 1.0000 / 64 |" in report
    assert "| dense | r | 1 | layer" not in report
    assert "| old | r | 3 | layer0 | 19.0000 / 256 |  | 0.5000 | 30.0000 |" in report


# the docs page that holds each study's generated report (regenerate it with the study's report command)
STUDY_PAGES = {"long_context": "long_context.md", "codebooks": "codebooks.md", "recall": "recall.md",
               "repeat": "long_context.md", "repeat_gpu": "long_context.md",
               "repeat_smear": "long_context.md", "repeat_from_dense": "long_context.md",
               "vq_cache_learning": "vq_cache_learning.md"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(STUDY_PAGES))
def test_the_docs_tables_are_the_committed_result_files(name: str, tmp_path: Path) -> None:
    """Every table row of the report generated from ``studies/<name>/results/`` (kept in git) is in the study's
    docs page, and every result file copied from another study's has that file's config and evaluations: the
    pages cannot drift from their result files."""
    shutil.copytree(REPO / "studies" / name / "results", tmp_path / "results")
    report = write_report(tmp_path, name, figures=tmp_path / "figures").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| run |")]
    doc = (REPO / "docs" / STUDY_PAGES[name]).read_text()
    assert rows and all(row in doc for row in rows), [row for row in rows if row not in doc]
    for result in load_results(REPO / "studies" / name):
        if "copied_from" in result:
            source = json.loads((REPO / result["copied_from"]).read_text())
            assert result["evaluations"] == source["evaluations"] and result["config"] == source["config"]


def test_a_report_goes_between_the_pages_markers_with_its_figures_linked_from_the_page(
    tmp_path: Path,
) -> None:
    from tvq_exp.tools.study.report import into_page

    report = tmp_path / "study/report.md"
    report.parent.mkdir()
    report.write_text("# Study x\n\n| run |\n![test](test.png)\n![a b](test-accuracy-vs-state.png)\n")
    page = tmp_path / "docs/page.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- report: begin -->\nold rows\n<!-- report: end -->\nafter\n")
    into_page(report, page, tmp_path / "docs/figures/x")
    assert page.read_text() == (
        "intro\n<!-- report: begin -->\n| run |\n![test](figures/x/test.png)\n"
        "![a b](figures/x/test-accuracy-vs-state.png)\n<!-- report: end -->\nafter\n"
    )
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="report: begin"):
        into_page(report, page, tmp_path / "docs/figures/x")


def test_a_report_of_relative_folders_writes_its_figures_where_they_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out studies/x --figures docs/figures/x`` (relative to the working directory): the PNGs land in
    ``docs/figures/x``, not in ``docs/figures/x/docs/figures/x``, and the report names the folder as given."""
    monkeypatch.chdir(tmp_path)
    _write(Path("studies/x"), [_result("vq", 1, 2.0, accuracy=_accuracy(0.5, {"gap_0_32": 0.5}))])
    report = write_report(Path("studies/x"), "Study x", figures=Path("docs/figures/x")).read_text()
    assert (tmp_path / "docs/figures/x/test.png").is_file()
    assert (tmp_path / "docs/figures/x/test-accuracy-vs-state.png").is_file()
    assert not (tmp_path / "docs/figures/x/docs").exists()
    assert "(`studies/x/results/*.json`)" in report


def test_a_comparison_pairs_two_runs_by_seed(tmp_path: Path) -> None:
    """Worked by hand: accuracies 0.8 / 0.9 / 0.7 against 0.7 / 0.8 / 0.75 give differences +0.1, +0.1, -0.05,
    mean +0.05, standard deviation sqrt(0.0075) = 0.0866, paired t 0.05 / (0.0866 / sqrt 3) = 1.00, higher in 2
    of 3; a seed only one run has is left out."""
    gaps = {"gap_1_8": 1.0}
    results = [_result("a", s, 1.0, _accuracy(x, gaps)) for s, x in ((1, 0.8), (2, 0.9), (3, 0.7), (4, 0.1))]
    results += [_result("b", s, 1.0, _accuracy(x, gaps)) for s, x in ((1, 0.7), (2, 0.8), (3, 0.75))]
    _write(tmp_path, results)
    report = write_report(tmp_path, "Study t", comparisons=[Comparison("a", "b", "r")]).read_text()
    row = "| a | b | r | accuracy | 1,2,3 | +0.100, +0.100, -0.050 | +0.0500 ± 0.0866 | 1.00 | 2 of 3 |"
    assert row in report
    assert "Runs compared" not in write_report(tmp_path, "Study t").read_text()  # none asked for, none shown


def test_a_comparison_naming_an_unknown_run_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nruns: {x: {}, y: {}}\nevaluate: []\ncompare: [{run: x, against: z, regime: default}]\n"
    )
    with pytest.raises(ValueError, match=r"compare\[0\].against='z'.*runs \(x, y\)"):
        load_study(path)
    path.write_text("name: s\nruns: {x: {}, y: {}}\nevaluate: []\ncompare: [{run: x, against: y}]\n")
    with pytest.raises(ValueError, match=r"compare\[0\] needs regime"):
        load_study(path)
