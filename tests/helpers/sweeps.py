"""A small real sweep shared by the sweep, analysis and notebook tests (run once per test process).

Two jobs of ``python train.py -m`` on the Gutenberg books with the tiny GAU-VQ model (codebook sizes 16
and 32), four steps each.
Tests using it carry ``pytest.mark.xdist_group("small_sweep")`` so that one xdist worker runs them all.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tvq_exp.tools import train_command

GROUP = pytest.mark.xdist_group("small_sweep")
SWEEP_VALUES = (16, 32)
OK_JOBS = ("0", "1")
SWEEP_OVERRIDES = (
    "experiment=smoke",
    f"model.attention.codebook_size={','.join(map(str, SWEEP_VALUES))}",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    # The dashboard callbacks (in conf/callbacks/default.yaml; `++` also works where they are absent).
    "++callbacks.hparams._target_=tvq_exp.callbacks.final_hparams.FinalHParams",
    "++callbacks.samples._target_=tvq_exp.callbacks.text_samples.TextSamples",
    "++callbacks.samples.num_bytes=16",
)
_SWEEPS: dict[Path, Path] = {}


def run_train(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``train.py ARGS`` in a subprocess from ``cwd``; fail the test with its output if it fails."""
    proc = train_command.run_train(args, cwd, timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"train.py {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def make_small_sweep(base: Path) -> Path:
    """Run the sweep into ``<base>/small_sweep`` once per process; returns the sweep directory."""
    if base not in _SWEEPS:
        sweep_dir = base / "small_sweep"
        run_train(["-m", *SWEEP_OVERRIDES, f"hydra.sweep.dir={sweep_dir}"], cwd=base)
        _SWEEPS[base] = sweep_dir
    return _SWEEPS[base]


__all__ = ["GROUP", "OK_JOBS", "REPO", "SWEEP_OVERRIDES", "SWEEP_VALUES", "make_small_sweep", "run_train"]
