"""A multirun with a failed job exits non-zero, naming it (``tvq_exp.run.sweeps.SweepStatus``), after the other
jobs ran; a sweep whose jobs all succeed exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO
from tests.run.test_reliability import needs_data

pytestmark = needs_data


def test_a_multirun_with_a_failed_job_exits_non_zero(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    command = [
        sys.executable, str(REPO / "train.py"), "-m", "experiment=smoke", "trainer.max_steps=2",
        "trainer.enable_progress_bar=false", "model.attention.codebook_size=1,16", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert last == f"error: 1 sweep job(s) failed ({sweep / '0'}); see their error.txt", last
    assert "must be >= 2" in (sweep / "0" / "error.txt").read_text()
    assert (sweep / "1" / "finished.json").is_file()  # the other job still ran
    ok = subprocess.run(command[:-2] + ["model.attention.codebook_size=16", f"hydra.sweep.dir={tmp_path / 'ok'}"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0, ok.stderr[-2000:]
