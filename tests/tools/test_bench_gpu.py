"""``make bench-gpu``: skips in one line without a GPU; its training figure and JSON writer, run at CPU size (the
attention section is ``python -m tvq_exp.bench attention``, tested in ``tests/tools/test_bench.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools.bench.gpu import run_sections, training_section, write_report

needs_data = pytest.mark.needs_data("text/gutenberg")


def test_without_a_gpu_it_skips_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "tvq_exp.tools.bench.gpu", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.splitlines() == [
        "bench-gpu: skipped, no CUDA device here (torch.cuda.is_available() is False)"
    ]
    assert not out.exists()


@needs_data
def test_the_training_section_at_cpu_size_into_the_json_file(tmp_path: Path) -> None:
    shape = ["experiment=smoke", "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1000000", "trainer.max_steps=1000000",
             "trainer.log_every_n_steps=2", "logger=csv", "trainer.enable_progress_bar=false", "torch_threads=1"]  # fmt: skip
    training = training_section(shape, seconds=8, batch_sizes=[8])
    path = write_report(tmp_path / "bench" / "gpu.json", {"training": training})

    written = json.loads(path.read_text())
    train = written["training"]
    assert train["batch_size"] == 8 and train["tried"] == [] and train["last_step"] > 2
    assert train["tokens_per_s"] > 0 and train["peak_mem_mb"] > 0
    assert not (tmp_path / "bench" / "gpu.json.part").exists()


def test_a_run_cut_short_keeps_the_sections_that_finished(tmp_path: Path) -> None:
    # a device call's time limit kills the check mid-way: what finished before is already in the file
    def cut() -> dict[str, str]:
        assert json.loads(path.read_text()) == {"device": {"name": "gpu"}, "attention": {"records": [1]}}
        raise KeyboardInterrupt  # as the limit's kill would stop it

    path = tmp_path / "gpu.json"
    with pytest.raises(KeyboardInterrupt):
        run_sections(
            path, {"device": {"name": "gpu"}}, [("attention", lambda: {"records": [1]}), ("training", cut)]
        )
    assert json.loads(path.read_text()) == {"device": {"name": "gpu"}, "attention": {"records": [1]}}
    run_sections(path, {}, [("tests", lambda: {"tests": 3})])
    assert json.loads(path.read_text()) == {"tests": {"tests": 3}}
