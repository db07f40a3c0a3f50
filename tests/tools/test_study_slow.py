"""The studies at one seed (``make test-slow``): every run of conf/study/long_context.yaml (both regimes) and of
conf/study/recall.yaml and conf/study/codebooks.yaml trains, is evaluated and reported from its result files. Hours on 2 CPU cores; set
``TVQ_STUDY_DIR`` to a folder to keep (and resume) the runs, e.g. ``studies``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools.study.results import load_results
from tvq_exp.tools.study.spec import load_study


@pytest.mark.slow
@pytest.mark.parametrize("name", ["long_context", "recall", "codebooks"])
def test_a_study_at_one_seed_runs_and_reports(name: str, tmp_path: Path) -> None:
    out = Path(os.environ.get("TVQ_STUDY_DIR", tmp_path)) / name
    study = REPO / "conf" / "study" / f"{name}.yaml"
    command = [sys.executable, "-m", "tvq_exp.analysis", "study"]
    run = subprocess.run([*command, "run", str(study), "--out", str(out), "--seeds", "1", "--parallel", "2"],
                         cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and "failed" not in run.stdout, run.stdout + run.stderr[-3000:]
    expected = {job.id for job in load_study(study).jobs if job.seed == 1}
    results = {r["id"]: r for r in load_results(out) if r["seed"] == 1}
    assert expected <= set(results), sorted(expected - set(results))
    for result in results.values():
        for evaluation in result["evaluations"].values():  # the position buckets add up to the whole
            buckets = evaluation["position_buckets"]
            tokens = sum(b["tokens"] for b in buckets)
            mean = sum(b["bpb"] * b["tokens"] for b in buckets) / tokens
            assert tokens == evaluation["tokens"] and mean == pytest.approx(evaluation["bpb"], rel=1e-6)
    report = subprocess.run([*command, "report", str(study), "--out", str(out)], cwd=REPO, capture_output=True,
                            text=True)  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    text = (out / "report.md").read_text()
    everything = load_results(out)
    assert f"\n{len(everything)} jobs (`" in text
    # every evaluation has its section; at one seed, each (run, regime) row holds that job's own bits
    for result in results.values():
        for evaluation_name, evaluation in result["evaluations"].items():
            assert f"## Evaluation `{evaluation_name}`" in text
            if all(r["seed"] == 1 for r in everything):
                row = f"| {result['run']} | {result['regime']} | 1 | {evaluation['bpb']:.4f} |"
                assert row in text, row
    print(text)
