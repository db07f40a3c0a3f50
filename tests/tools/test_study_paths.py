"""Study result files name paths relative to the repository, never the directories of the machine that ran
them: the runner writes them so, and the committed files are so (``tools/relative_study_paths.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools.study.runner import repo_relative, run_logged


def test_paths_under_the_repository_become_relative() -> None:
    root = Path("/machine/repo")
    result = {
        "train": {"best_ckpt": "/machine/repo/studies/s/runs/a/checkpoints/best.ckpt", "global_step": 4},
        "evaluations": {"test": {"checkpoint": "/machine/repo/studies/s/runs/a/checkpoints/last.ckpt"}},
        "config": {
            "data": {"root": "/elsewhere/datasets"},
            "overrides": ["/machine/repo/x", "/machine/repox"],
        },
    }
    assert repo_relative(result, root) == {
        "train": {"best_ckpt": "studies/s/runs/a/checkpoints/best.ckpt", "global_step": 4},
        "evaluations": {"test": {"checkpoint": "studies/s/runs/a/checkpoints/last.ckpt"}},
        "config": {"data": {"root": "/elsewhere/datasets"}, "overrides": ["x", "/machine/repox"]},
    }


def test_committed_result_files_hold_no_absolute_study_paths() -> None:
    files = sorted(REPO.glob("studies/*/results/*.json"))
    assert files
    for path in files:
        text = path.read_text()
        result = json.loads(text)
        assert "/studies/" not in text.replace('"studies/', ""), path.name
        assert result["train"]["last_ckpt"].startswith("studies/"), path.name


def test_a_job_log_lands_in_its_run_dir_when_the_study_folder_is_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out studies/x`` (relative to the working directory): the log goes to ``studies/x/runs/<job>/job.log``,
    not to ``studies/x/studies/x/...`` (the writers take a relative path as relative to the study folder)."""
    monkeypatch.chdir(tmp_path)
    out = Path("studies/x")
    run_logged([sys.executable, "-c", "print('trained')"], out / "runs/j/job.log", 1, out)
    assert "trained" in (tmp_path / "studies/x/runs/j/job.log").read_text()
    assert not (tmp_path / "studies/x/studies").exists()
