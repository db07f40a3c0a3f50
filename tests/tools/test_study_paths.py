"""Study result files name paths relative to the repository, never the directories of the machine that ran
them: the runner writes them so, and the committed files are so (``tools/relative_study_paths.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.paths import REPO
from tvq_exp.tools.study.runner import repo_relative


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
