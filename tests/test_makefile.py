"""The Makefile as a new user meets it: the set-up is two commands (``make test`` and ``make train`` create
``.venv`` where it is missing), ``make help`` is plain text in a pipe, ``make tensorboard`` binds to localhost
unless ``TB_HOST`` says otherwise. Dry runs (``make -n``): nothing is installed or started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO


def make(*args: str, **env: str) -> str:
    """``make ARGS`` in the repository, stdout piped; returns what it printed."""
    proc = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=True,
    )
    return proc.stdout


@pytest.mark.parametrize("target", ["test", "train"])
def test_set_up_targets_create_the_venv_where_it_is_missing(target: str, tmp_path: Path) -> None:
    missing = tmp_path / "venv" / "bin" / "python"
    out = make("-n", target, f"PY={missing}")
    assert "make install" in out and "python3 -m venv .venv" in out
    assert out.splitlines()[-1].startswith(f"{missing} ")  # installed, then run
    assert "python3 -m venv" not in make("-n", target)  # the venv exists here: not installed again


def test_help_has_no_colour_codes_in_a_pipe() -> None:
    out = make("help")
    assert "\x1b[" not in out
    assert "  test " in out and "  train " in out


def test_tensorboard_binds_localhost_unless_asked() -> None:
    out = make("-n", "tensorboard")
    assert "--host localhost" in out and "--bind_all" not in out
    assert "--host 0.0.0.0" in make("-n", "tensorboard", TB_HOST="0.0.0.0")


def test_the_device_kernel_report_compiles_with_the_device_triton_installed_beside_the_venv() -> None:
    out = make("-n", "kernel-report-device", "DEVICE_TRITON=3.6.0")
    assert "--target .triton/3.6.0 triton==3.6.0" in out  # installed once, beside the venv's own Triton
    assert out.splitlines()[-1].startswith("PYTHONPATH=.triton/3.6.0 ")  # ahead of the venv's on the path
    assert out.splitlines()[-1].endswith("-m tvq_exp.attention.vq.fused.report")
