"""FLOP formulas (backends, blocks, whole decoder) against the matmuls FlopCounterMode counts, and the
FLOP utilisation the Throughput callback logs."""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from tests.attention.backends import NAMES, backend_class, build, small_options
from tests.helpers.config import compose_config
from tests.helpers.paths import CONF
from tvq_exp.attention import build_attention
from tvq_exp.attention.vq import VQAttention
from tvq_exp.callbacks.throughput import Throughput, precision_dtype, training_dtype
from tvq_exp.measure.peaks import datasheet_peak_flops, device_peak_flops
from tvq_exp.measure.timing import matmul_peak_flops
from tvq_exp.models.blocks import GAUBlock, MHABlock
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.module import AutoregressiveLitModule as LanguageModel

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
D_K, D_V, BATCH, T = 8, 12, 2, 40  # T is a multiple of no chunk, group or block length below but 8


def _counted(fn: Callable[[], None]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _assert_counts(run: Callable[[], Tensor], formula: Callable[..., int | None]) -> None:
    """``formula(backward=...)`` equals the counted matmuls of ``run`` (forward) and of ``run`` plus a
    backward of a random output gradient."""

    def train() -> None:
        out = run()
        out.backward(torch.randn_like(out))

    assert _counted(run) == formula(backward=False)
    assert _counted(train) == formula(backward=True)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        *((name, small_options(name, length=8, codes=16)) for name in NAMES),
        ("dense", {}),
        ("dense", {"window_bias": True, "window_len": 8}),
        ("dense", {"score": "relu2"}),
        ("dense", {"score": "relu2", "window_bias": True, "window_len": 8}),
        ("dense", {"heads": 3, "talking_heads": True}),
        ("dense", {"heads": 4, "kv_heads": 2, "talking_heads": True, "talking_heads_post": True}),
        ("dense", {"causal": False, "window_bias": True, "window_len": 8}),
        ("vq", {"codebook_size": 16, "block_len": 8, "window_bias": False}),
        ("vq", {"codebook_size": 16, "block_len": 16, "window_bias": True, "heads": 2, "kv_heads": 1}),
        ("vq", {"codebook_size": 16, "block_len": 16, "window_bias": False, "use_cache": False}),
        ("vq", {"codebook_size": 16, "block_len": 64, "window_bias": True, "window_len": 10}),  # one block
        ("vq", {"codebook_size": 16, "block_len": 8, "window_len": 5, "grad_through_cache": False}),
        ("linear", {}),  # one chunk shorter than chunk_size
        ("linear", {"chunk_size": 16}),
        ("linear", {"chunk_size": 16, "feature_map": "favor", "num_features": 12}),
        ("linear", {"chunk_size": 7, "feature_map": "relu", "heads": 4, "kv_heads": 2}),
        ("linear", {"causal": False, "feature_map": "favor"}),
        ("flash_chunk", {"group_size": 16}),
        ("flash_chunk", {"group_size": 64}),  # one group longer than the sequence
        (
            "flash_chunk",
            {"group_size": 16, "window_bias": True, "score": "softmax", "heads": 4, "kv_heads": 2},
        ),
        (
            "flash_chunk",
            {"group_size": 16, "window_bias": True, "window_len": 5, "causal": False, "norm": "fixed"},
        ),
    ],
)
def test_attention_flops_match_counted_matmuls(name: str, options: dict[str, Any]) -> None:
    opts = dict(options)
    heads = opts.pop("heads", 1)
    kv_heads = opts.get("kv_heads", heads)
    attn = build(name, d_k=D_K, d_v=D_V, heads=heads, **opts)
    q = torch.randn(BATCH, heads, T, D_K, requires_grad=True)
    k = torch.randn(BATCH, kv_heads, T, D_K, requires_grad=True)
    v = torch.randn(BATCH, kv_heads, T, D_V, requires_grad=True)
    _assert_counts(lambda: attn(q, k, v)[0], functools.partial(attn.flops, T, BATCH))


def test_vq_flops_are_the_same_whatever_kernel_runs() -> None:
    """MFU compares kernels on the same work: the count is the plain kernel's (checked above against the counted
    matmuls) for every kernel VQ offers (a fused kernel that skips masked tiles included), before and after a
    call."""
    attn = build("vq", d_k=D_K, d_v=D_V, heads=2, codebook_size=16, block_len=8)
    counts = {(T, False): attn.flops(T, BATCH), (T, True): attn.flops(T, BATCH, backward=True)}
    q, k, v = torch.randn(BATCH, 2, T, D_K), torch.randn(BATCH, 2, T, D_K), torch.randn(BATCH, 2, T, D_V)
    attn(q, k, v)
    for kernel in VQAttention.kernels:
        attn.kernel = attn.last_kernel = kernel
        assert {key: attn.flops(key[0], BATCH, backward=key[1]) for key in counts} == counts, kernel


def _position(name: str) -> str:
    """XL positions where the backend takes the bias, else RoPE."""
    return "xl" if backend_class(name).supports_position_bias else "rope"


@pytest.mark.parametrize(
    ("name", "options"),
    [
        *((name, small_options(name, length=8, codes=16, position_bias=False)) for name in NAMES),
        ("linear", {"chunk_size": 16, "feature_map": "favor"}),
        ("flash_chunk", {"group_size": 16}),
    ],
)
def test_gau_block_flops_match_counted_matmuls(name: str, options: dict[str, Any]) -> None:
    position = _position(name)
    attention = functools.partial(build_attention, name, **options)
    block = GAUBlock(d_model=16, attention=attention, d_k=D_K, heads=2, position=position)
    x = torch.randn(BATCH, T, 16, requires_grad=True)
    _assert_counts(lambda: block(x)[0], functools.partial(block.flops, T, BATCH))


@pytest.mark.parametrize(
    ("name", "options", "sizes"),
    [
        *((name, small_options(name, length=8, codes=16, position_bias=False), {}) for name in NAMES),
        (
            "dense",
            {"window_len": 8, "talking_heads": True},
            {"key_size": 6, "head_size": 10, "kv_heads": 2, "ff_mult": 2.0},
        ),
        ("vq", {"codebook_size": 16, "block_len": 8}, {"kv_heads": 1}),
        (
            "linear",
            {"chunk_size": 16, "feature_map": "favor", "num_features": 6},
            {"key_size": 6, "kv_heads": 2},
        ),
        ("flash_chunk", {"group_size": 16, "score": "softmax"}, {"head_size": 6, "ff_mult": 3.0}),
    ],
)
def test_mha_block_flops_match_counted_matmuls(
    name: str, options: dict[str, Any], sizes: dict[str, Any]
) -> None:
    position = _position(name)
    attention = functools.partial(build_attention, name, **options)
    block = MHABlock(d_model=16, attention=attention, heads=4, position=position, **sizes)
    x = torch.randn(BATCH, T, 16, requires_grad=True)
    _assert_counts(lambda: block(x)[0], functools.partial(block.flops, T, BATCH))


def tiny_preset(name: str) -> Decoder:
    """The model preset ``conf/model/<name>.yaml``, 2 blocks of width 32, every chunk / group / block /
    bias window 8 long (so a 20-token sequence ends in a partial one)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "model.d_model=32", "model.n_layers=2"])
    cfg.model.attention.update(
        small_options(cfg.model.attention.name, length=8, codes=16, position_bias=False)
    )
    if "d_k" in cfg.model.block:
        cfg.model.block.d_k = 16
    return instantiate(cfg.model).train()


@pytest.mark.parametrize("preset", MODELS)
def test_model_flops_match_a_counted_training_step(preset: str) -> None:
    model = tiny_preset(preset)
    tokens = torch.randint(0, model.vocab_size, (BATCH, 20))

    def step() -> None:
        out = model(tokens)
        loss = F.cross_entropy(out.logits.flatten(0, 1), tokens.flatten()) + out.aux["loss"]
        loss.backward()

    assert _counted(lambda: model(tokens)) == model.flops(20, BATCH)
    assert _counted(step) == model.flops(20, BATCH, backward=True)


def test_missing_formulas_give_none(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = build("vq", d_k=8, d_v=8, codebook_size=4, block_len=8, causal=False)
    assert encoder.flops(128) is None  # the encoder form has no formula
    block = GAUBlock(
        d_model=16,
        attention=functools.partial(build_attention, "vq", causal=False, codebook_size=4, block_len=8),
    )
    assert block.flops(128) is None
    model = tiny_preset("mha_linear")
    assert model.flops(16) is not None
    monkeypatch.setattr(type(model.blocks[0].attn), "flops", lambda self, *args, **kw: None)
    assert model.flops(16) is None
    model.blocks[0] = nn.Identity()  # a block without a formula
    assert model.flops(16) is None


# ------------------------------------------------------------------------------------------- throughput


def test_precision_dtype() -> None:
    assert precision_dtype("bf16-mixed") == precision_dtype("bf16-true") == torch.bfloat16
    assert precision_dtype("16-mixed") == torch.float16 and precision_dtype("64-true") == torch.float64
    assert precision_dtype("32-true") == precision_dtype(32) == precision_dtype(None) == torch.float32


def test_the_matmul_peak_is_measured_in_the_dtype_the_model_computes_in() -> None:
    """MFU's ceiling: ``trainer=fsdp`` sets ``32-true`` precision (its fp32 master weights) and computes in its
    ``param_dtype``, bf16: an fp32 ceiling would make its MFU several times too large."""
    trainer = lambda precision, strategy: SimpleNamespace(precision=precision, strategy=strategy)  # noqa: E731
    fsdp = compose_config("train", ["trainer=fsdp"]).trainer
    assert training_dtype(
        trainer(fsdp.precision, SimpleNamespace(param_dtype=fsdp.strategy.param_dtype))
    ) == (torch.bfloat16)
    assert training_dtype(trainer("32-true", SimpleNamespace(param_dtype="fp16"))) == torch.float16
    assert training_dtype(trainer("bf16-mixed", SimpleNamespace())) == torch.bfloat16
    assert training_dtype(trainer("32-true", SimpleNamespace())) == torch.float32


def test_matmul_peak_is_the_fastest_square_product(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 3.0, 3.0, 4.0, 4.0, 6.0])  # the warm-up takes 3 s, then 1 s and 2 s
    monkeypatch.setattr("tvq_exp.measure.timing.time.perf_counter", lambda: next(clock))
    assert matmul_peak_flops(torch.device("cpu"), torch.float32, size=64, reps=2) == 2 * 64**3


def _fit(tmp_path: Path, steps: int = 6) -> dict[str, list[float]]:
    """Train a tiny GAU-VQ decoder for ``steps`` on random tokens (logging every 2 steps to CSV);
    returns the logged ``throughput/`` columns."""
    model = tiny_preset("tiny")
    module = LanguageModel(model, lr=1e-3, max_steps=steps)
    tokens = torch.randint(0, model.vocab_size, (steps * 4, 33))
    data = [{"input": row[:-1], "target": row[1:]} for row in tokens]
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        precision="32-true",
        log_every_n_steps=2,
        logger=CSVLogger(tmp_path, name="csv", version=""),
        callbacks=[Throughput()],
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=4))
    with (tmp_path / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = {key for row in rows for key in row if key.startswith("throughput/")}
    return {key: [float(row[key]) for row in rows if row.get(key)] for key in columns}


def test_throughput_logs_flop_utilisation(tmp_path: Path) -> None:
    logged = _fit(tmp_path)
    assert len(logged["throughput/tokens_per_s"]) == 3
    assert len(logged["throughput/mfu"]) == len(logged["throughput/tflops_per_s"]) == 3
    assert all(0 < mfu <= 1 for mfu in logged["throughput/mfu"])
    assert all(tflops > 0 for tflops in logged["throughput/tflops_per_s"])
    # achieved FLOP/s is the model's FLOPs per token times the logged tokens per second
    per_token = tiny_preset("tiny").flops(32, 4, backward=True) / (4 * 32)
    for tflops, tokens in zip(
        logged["throughput/tflops_per_s"], logged["throughput/tokens_per_s"], strict=True
    ):
        assert tflops == pytest.approx(tokens * per_token / 1e12, rel=1e-9)


def test_datasheet_peaks_by_device_name() -> None:
    names = {
        "NVIDIA H100 80GB HBM3": 989, "NVIDIA H100 PCIe": 756, "NVIDIA H100 NVL": 835, "NVIDIA H200": 989,
        "NVIDIA A100-SXM4-80GB": 312, "NVIDIA A100 80GB PCIe": 312, "NVIDIA L4": 121, "NVIDIA L40S": 362,
    }  # fmt: skip
    assert {name: datasheet_peak_flops(name) / 1e12 for name in names} == names
    assert datasheet_peak_flops("Tesla V100-SXM2-16GB") is None  # no bf16: no datasheet MFU
    assert device_peak_flops(torch.device("cpu")) is None


def test_throughput_logs_the_datasheet_mfu_on_a_named_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "throughput/mfu_datasheet" not in _fit(tmp_path / "cpu", steps=2)  # a CPU has no datasheet peak
    h100 = datasheet_peak_flops("NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("tvq_exp.callbacks.throughput.device_peak_flops", lambda device: h100)
    logged = _fit(tmp_path / "h100", steps=4)
    assert len(logged["throughput/mfu_datasheet"]) == 2
    for mfu, tflops in zip(
        logged["throughput/mfu_datasheet"], logged["throughput/tflops_per_s"], strict=True
    ):
        assert mfu == pytest.approx(tflops / 989, rel=1e-9)


def test_throughput_logs_no_flops_without_a_formula(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(VQAttention, "flops", lambda self, *args, **kw: None)
    logged = _fit(tmp_path, steps=2)
    assert logged["throughput/tokens_per_s"] and "throughput/mfu" not in logged
    assert "throughput/tflops_per_s" not in logged


@pytest.mark.parametrize(
    "options",
    [
        {"window_bias": True, "window_len": 8},
        {"score": "relu2", "heads": 2},
        {"heads": 3, "talking_heads": True, "talking_heads_post": True},
        {"causal": False, "window_bias": True, "window_len": 8},
    ],
)
def test_chunked_dense_flops_match_counted_matmuls(monkeypatch, options: dict[str, Any]) -> None:
    """Dense attention with explicit logits beyond the budget: chunked rows over their visible keys,
    recomputed in the backward, counted exactly (fewer FLOPs than the full square when causal)."""
    from tvq_exp.attention.dense import layer as dense

    monkeypatch.setattr(dense, "LOGITS_BUDGET", BATCH * options.get("heads", 1) * T * 7)  # rows of 7
    test_attention_flops_match_counted_matmuls("dense", options)
    opts = {k: v for k, v in options.items() if k != "heads"}
    attn = build("dense", d_k=D_K, d_v=D_V, heads=options.get("heads", 1), **opts)
    chunked = attn.flops(T)
    monkeypatch.setattr(dense, "LOGITS_BUDGET", 1 << 24)
    whole = attn.flops(T)
    assert (chunked < whole) if options.get("causal", True) else (chunked == whole)
