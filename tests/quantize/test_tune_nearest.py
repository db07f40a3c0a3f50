"""The nearest-code search's tile timing (``python -m tvq_exp.quantize.tune_nearest``), run on the CPU under
Triton's interpreter: every search it times, in its order, finds the plain search's codes; the JSON holds each
record; the shipped tiles are restored."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tvq_exp.quantize import fused_nearest, tune_nearest


def test_times_the_plain_the_fp32_and_each_bf16_tiling_and_each_finds_the_plain_codes(tmp_path: Path) -> None:
    shipped = fused_nearest.TILES[torch.bfloat16]
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
    assert fused_nearest.TILES[torch.bfloat16] == shipped
