"""The benchmark CLI on tiny configurations and the FLOP formulas against counted matmuls."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tvq_exp import bench
from tvq_exp.attention import build_attention
from tvq_exp.blocks import GAUBlock
from tvq_exp.flops import attention_flops, gau_block_flops

FIELDS = {
    "backend",
    "seq_len",
    "mode",
    "ms",
    "tokens_per_s",
    "peak_mem_mb",
    "gflops",
    "gflops_per_s",
    "mm_fraction",
}
TINY = ["--reps", "1", "--budget", "0", "--threads", "1"]


def _counted(fn: Callable[[], None]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_attention_bench_writes_documented_records(tmp_path: Path) -> None:
    out = tmp_path / "attn.json"
    argv = [
        "attention",
        "--backends",
        "vq,no_such_backend",
        "--lengths",
        "64",
        "--mode",
        "fwdbwd",
        "--mm-size",
        "64",
    ]
    bench.main([*argv, *TINY, "--json", str(out)])
    records = json.loads(out.read_text())
    assert len(records) == 2 and all(FIELDS <= rec.keys() for rec in records)
    vq, missing = records
    assert vq["backend"] == "vq" and vq["seq_len"] == 64 and vq["mode"] == "fwdbwd"
    assert vq["ms"] > 0 and vq["tokens_per_s"] > 0 and vq["peak_mem_mb"] >= 0
    assert vq["gflops"] > 0 and vq["mm_fraction"] > 0
    assert "unknown backend" in missing["error"] and missing["ms"] is None


def test_model_bench_writes_records_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "model.json", tmp_path / "model.png"
    argv = [
        "model",
        "--models",
        "gau_vq,no_such_preset",
        "--lengths",
        "64",
        *TINY,
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    bench.main(argv)
    records = json.loads(out.read_text())
    assert [r["backend"] for r in records] == ["gau_vq", "no_such_preset"]
    assert all(FIELDS <= rec.keys() for rec in records)
    assert records[0]["tokens_per_s"] > 0 and records[0]["peak_mem_mb"] >= 0
    assert "no conf/model/no_such_preset.yaml" in records[1]["error"]
    assert png.stat().st_size > 0


def test_model_preset_is_composed_at_bench_width() -> None:
    cfg = bench.compose_model("gau_vq", bench.MODEL_SETTINGS)
    assert cfg.model.d_model == 256 and cfg.model.n_layers == 4
    assert cfg.model.attention.codebook_size == 512 and cfg.model.attention.block_len == 512


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("dense", {}),
        ("dense", {"window_bias": True, "window_len": 8}),
        ("vq", {"codebook_size": 16, "block_len": 8, "window_bias": False}),
        ("vq", {"codebook_size": 16, "block_len": 16, "window_bias": True, "heads": 2, "kv_heads": 1}),
        ("vq", {"codebook_size": 16, "block_len": 16, "window_bias": False, "use_cache": False}),
    ],
)
def test_attention_flops_match_counted_matmuls(name: str, options: dict) -> None:
    opts = dict(options)
    heads = opts.pop("heads", 1)
    kv_heads = opts.get("kv_heads", heads)
    attn = build_attention(name, d_k=8, d_v=12, heads=heads, **opts)
    t = 40  # not a multiple of the VQ block length: the padded tail is counted too
    q = torch.randn(1, heads, t, 8, requires_grad=True)
    k = torch.randn(1, kv_heads, t, 8, requires_grad=True)
    v = torch.randn(1, kv_heads, t, 12, requires_grad=True)

    def train() -> None:
        out, _, _ = attn(q, k, v)
        out.backward(torch.randn_like(out))

    assert _counted(lambda: attn(q, k, v)) == attention_flops(name, t, d_k=8, d_v=12, heads=heads, **opts)
    assert _counted(train) == attention_flops(name, t, d_k=8, d_v=12, heads=heads, backward=True, **opts)


@pytest.mark.parametrize(
    ("name", "options"), [("dense", {"window_len": 8}), ("vq", {"codebook_size": 16, "block_len": 8})]
)
def test_gau_block_flops_match_counted_matmuls(name: str, options: dict) -> None:
    block = GAUBlock(d_model=16, attention=functools.partial(build_attention, name, **options), d_k=8)
    x = torch.randn(2, 40, 16, requires_grad=True)

    def train() -> None:
        y, _, _ = block(x)
        y.backward(torch.randn_like(y))

    kw = {"d_k": 8, "batch": 2, "window_bias": True, **options}
    assert _counted(lambda: block(x)) == gau_block_flops(40, 16, name, **kw)
    assert _counted(train) == gau_block_flops(40, 16, name, backward=True, **kw)


def test_unknown_backend_has_no_formula() -> None:
    assert attention_flops("no_such_backend", 128, d_k=8, d_v=8) is None
    assert gau_block_flops(128, 16, "no_such_backend") is None
