"""The nearest-code search's tile timing (``python -m tvq_exp.quantize.tune_nearest``), run on the CPU under
Triton's interpreter: every search it times, in its order, finds the plain search's codes and launches with its own
rows a program; the JSON holds each record; the shipped tiles are restored."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tvq_exp.quantize import fused_nearest, tune_nearest


def test_times_the_plain_the_fp32_and_each_bf16_tiling_and_each_finds_the_plain_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = fused_nearest.TILES[torch.bfloat16]
    launched = []  # each search launch's rows a program (the grid's cdiv; not the codebook pieces' launch)
    cdiv = fused_nearest.cdiv

    def spy(n: int, rows: int) -> int:
        if sys._getframe(1).f_code.co_name == "search":
            launched.append(rows)
        return cdiv(n, rows)

    monkeypatch.setattr(fused_nearest, "cdiv", spy)
    out = tmp_path / "nearest.json"
    args = ["--device", "cpu", "--keys", "600", "--heads", "2", "--codes", "80", "--dim", "24", "--reps", "1"]
    assert tune_nearest.main([*args, "--out", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    tilings = ["x".join(map(str, t)) for t in (shipped, *tune_nearest.CANDIDATES)]
    assert [r["search"] for r in records] == [
        "plain", "fused, fp32 keys", f"fused, bf16 keys, {tilings[0]} (shipped)",
        *(f"fused, bf16 keys, {t}" for t in tilings[1:]),
    ]  # fmt: skip
    assert all(r["differ"] == 0.0 and r["ms"] > 0 for r in records)
    # a run of launches at the same rows counts once
    runs = [rows for i, rows in enumerate(launched) if i == 0 or rows != launched[i - 1]]
    want = [fused_nearest.TILES[torch.float32][0], *(t[0] for t in (shipped, *tune_nearest.CANDIDATES))]
    assert runs == [rows for i, rows in enumerate(want) if i == 0 or rows != want[i - 1]]
    assert fused_nearest.TILES[torch.bfloat16] == shipped
