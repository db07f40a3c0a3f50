"""The analysis and study commands' error paths: a missing or run-less folder, a study job that fails, a
selection that picks no job. Each ends in one ``error:`` line and a non-zero exit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tvq_exp import analysis


def _refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        analysis.main(argv)
    message = str(exit_info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_report_refuses_a_missing_or_run_less_folder(tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert "no such folder" in _refused([str(tmp_path / "missing"), "--out", str(out)])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a run")
    assert "holds no run" in _refused([str(tmp_path / "empty"), "--out", str(out)])
    assert not out.exists()


def test_a_failed_study_job_makes_the_study_exit_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    study = tmp_path / "broken.yaml"
    study.write_text(
        "name: broken\nbase: [experiment=smoke, trainer.max_steps=2]\n"
        "runs:\n  bad: {overrides: [model.attention.codebook_size=1], seeds: [1]}\n"
        "evaluate:\n  - {name: test, split: test}\n"
    )
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the study runs train.py from the repository
    message = _refused(["study", "run", str(study), "--out", str(tmp_path / "s"), "--cores", "1"])
    assert message.startswith("error: 1 of 1 study jobs failed (bad--default--s1)")
    assert not list((tmp_path / "s").rglob("results/*.json"))
    log = next((tmp_path / "s").rglob("job.log")).read_text()
    assert "model.attention.codebook_size=1: must be >= 2" in log
    assert "select no job" in _refused(
        ["study", "run", str(study), "--out", str(tmp_path / "s"), "--seeds", "9"]
    )
    (tmp_path / "malformed.yaml").write_text("name: m\nruns: {}\n")
    assert "a study needs" in _refused(
        ["study", "run", str(tmp_path / "malformed.yaml"), "--out", str(tmp_path)]
    )
    assert "No such file" in _refused(["study", "run", str(tmp_path / "absent.yaml"), "--out", str(tmp_path)])
    assert os.environ["OMP_NUM_THREADS"] == "1"
