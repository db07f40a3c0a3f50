"""``train.py`` run as a child process, as the tools (and the tests) start it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_train(
    args: Sequence[str], cwd: str | Path = REPO, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``python train.py ARGS`` from ``cwd`` with this interpreter and Python's warnings off; its stdout and
    stderr captured as text (the caller reads ``returncode``)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, str(REPO / "train.py"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
