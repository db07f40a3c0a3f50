"""What the commands print and write: sampled text with its control bytes escaped, a partial evaluation saved
under its own name with its limit, ``--help`` text of our own."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import REPO
from tvq_exp.run.evaluate import default_eval_output
from tvq_exp.run.sample import printable


def test_sampled_control_bytes_are_escaped_for_the_terminal() -> None:
    raw = "ok\x1b[2J\x07bell\r\x00nul\x9b\tand\nnewline é"
    assert printable(raw) == "ok\\x1b[2J\\x07bell\\x0d\\x00nul\\x9b\tand\nnewline é"
    assert not any(ord(c) < 32 and c not in "\t\n" for c in printable("".join(map(chr, range(256)))))


def test_a_limited_evaluation_has_its_own_file_name() -> None:
    ckpt = "runs/a/checkpoints/last.ckpt"
    assert default_eval_output(ckpt, "val", "segment").name == "eval-last-val-segment.json"
    assert default_eval_output(ckpt, "val", "segment", 16).name == "eval-last-val-segment-limit16.json"
    assert default_eval_output(ckpt, "test", "split", 0.25).name == "eval-last-test-split-limit0.25.json"


def test_help_is_ours() -> None:
    shown = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    assert shown.startswith("train.py: train (or continue)") and "Powered by Hydra" not in shown
    assert (
        "debug: default, device_profile, fdr, limit, overfit, profiler" in shown
        and "ckpt_path=<run>" in shown
    )
