"""The codebook health callback: its key sample, its numbers against a direct computation over the same keys, the
usage warning, and a real training run that logs them (TensorBoard and CSV) and an eval JSON that repeats them."""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from torch._dynamo.utils import counters

from tests.helpers.paths import CONF
from tests.run.test_train import QUIET, needs_data, run_train, scalars
from tvq_exp.attention import build_attention
from tvq_exp.callbacks.codebook_health import CodebookHealth, KeyTally, vq_layers
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.dense_to_vq import collect_keys
from tvq_exp.models.module import AutoregressiveLitModule
from tvq_exp.quantize.health import code_counts, codebook_regret, dead_fraction, usage_perplexity
from tvq_exp.quantize.kmeans import nearest_code

METRICS = ("perplexity", "dead_fraction", "quant_error", "kmeans_error", "regret", "kmeans_perplexity")

# ------------------------------------------------------------------------------------------- the key sample


def _numbered_keys(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys ``(2, n, 3)`` whose first coordinate is the position, and codes ``(2, n)``."""
    keys = torch.stack([torch.arange(n, dtype=torch.float32), torch.zeros(n), torch.ones(n)], -1)
    return torch.stack([keys, -keys]), torch.stack([torch.arange(n) % 4, torch.zeros(n, dtype=torch.long)])


def _tally(
    keys: torch.Tensor, codes: torch.Tensor, sizes: list[int], capacity: int, seed: int = 0
) -> KeyTally:
    tally = KeyTally(torch.zeros(2, 4, 3), capacity, torch.Generator().manual_seed(seed))
    for part_keys, part_codes in zip(keys.split(sizes, 1), codes.split(sizes, 1), strict=True):
        tally.add(part_keys, part_codes)
    return tally


def test_key_tally_counts_every_key_and_samples_independently_of_batching() -> None:
    keys, codes = _numbered_keys(100)
    whole = _tally(keys, codes, [100], capacity=30)
    parts = _tally(keys, codes, [7, 50, 43], capacity=30)
    assert torch.equal(whole.keys, parts.keys) and torch.equal(whole.counts, parts.counts)
    assert whole.counts.tolist() == [[25.0] * 4, [100.0, 0.0, 0.0, 0.0]]
    positions = whole.keys[0, :, 0]
    assert whole.keys.shape == (2, 30, 3) and torch.equal(
        whole.keys[1], -whole.keys[0]
    )  # same positions per head
    assert bool((positions.diff() > 0).all())  # distinct positions, in arrival order
    everything = _tally(keys, codes, [60, 40], capacity=500)
    assert torch.equal(everything.keys, keys)


def test_key_tally_sample_is_uniform_over_batches() -> None:
    """Over 400 seeds each of 40 positions (two batches of 20) is kept ~ capacity/N = 1/4 of the time."""
    keys, codes = _numbered_keys(40)
    kept = torch.zeros(40)
    for seed in range(400):
        kept[_tally(keys, codes, [20, 20], capacity=10, seed=seed).keys[0, :, 0].long()] += 1
    rate = kept / 400
    assert abs(rate[:20].mean().item() - 0.25) < 0.02 and abs(rate[20:].mean().item() - 0.25) < 0.02
    assert rate.min() > 0.15 and rate.max() < 0.35


# ------------------------------------------------------------------------------------------- one validation


def _vq_module(codebook_size: int = 8) -> AutoregressiveLitModule:
    torch.manual_seed(0)
    attention = functools.partial(build_attention, "vq", codebook_size=codebook_size, block_len=8)
    model = Decoder(256, 16, 2, functools.partial(GAUBlock, d_k=8), attention)
    return AutoregressiveLitModule(model)


def _batches(n: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(n):
        x = torch.randint(0, 256, (4, 33), generator=g)
        batches.append({"input": x[:, :-1], "target": x[:, 1:]})  # no state carried: each batch fresh
    return batches


def test_callback_equals_a_direct_computation_over_the_validation_keys() -> None:
    module, batches = _vq_module(), _batches()
    health = CodebookHealth(sample_keys=10_000, kmeans_iters=5, seed=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[health], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.validate(module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
    model = module.model
    assert list(health.results) == ["layer0", "layer1"] and list(vq_layers(model)) == ["layer0", "layer1"]
    for i, keys in enumerate(collect_keys(model, batches)):  # pre-hooks on the attention: (H, N, d) per block
        codebook = model.blocks[i].attn.quantizer.codebook
        counts = code_counts(nearest_code(keys, codebook), 8)
        regret = codebook_regret(keys, codebook, 5, torch.Generator().manual_seed(2))
        expected = {
            "perplexity": usage_perplexity(counts).mean().item(),
            "dead_fraction": dead_fraction(counts).mean().item(),
            **regret._asdict(),
            "codebook_size": 8,
        }
        assert counts.sum() == 3 * 4 * 32
        assert health.results[f"layer{i}"] == pytest.approx(expected, rel=1e-6), i
    assert not any(q._forward_hooks for q in model.quantizers())  # unhooked after the validation


def test_compiled_blocks_take_the_hooks_without_a_graph_break_and_give_the_same_health() -> None:
    """Blocks compiled whole (``fullgraph=True``: a graph break raises) run the quantisers' hooks inside their
    graphs: the hooks only keep the keys, and the callback samples them after each batch, so a compiled validation
    gives the eager one's numbers."""
    batches = _batches()

    def validate(compiled: bool) -> dict[str, dict[str, float]]:
        module = _vq_module()
        if compiled:
            torch._dynamo.reset()
            counters.clear()
            module.compile, module.compile_scope = True, "blocks"
            module.compile_step(backend="aot_eager", fullgraph=True)
        health = CodebookHealth(sample_keys=50, kmeans_iters=5, seed=2)  # a sample of 50 of the 384 keys
        trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[health], enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.validate(
            module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False
        )
        if compiled:  # the blocks ran compiled, hooks and all, in one graph each
            assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
        return health.results

    eager, compiled = validate(compiled=False), validate(compiled=True)
    assert list(compiled) == list(eager) == ["layer0", "layer1"]
    for name, result in eager.items():
        assert compiled[name] == pytest.approx(result, rel=1e-5), name
    torch._dynamo.reset()


def test_no_quantisers_no_results() -> None:
    attention = functools.partial(build_attention, "dense", window_len=8)
    module = AutoregressiveLitModule(Decoder(256, 16, 1, functools.partial(GAUBlock, d_k=8), attention))
    health = CodebookHealth()
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[health], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.validate(
        module, dataloaders=torch.utils.data.DataLoader(_batches(1), batch_size=None), verbose=False
    )
    assert health.results == {}


def test_usage_warning_once_per_episode(capsys: pytest.CaptureFixture[str]) -> None:
    health = CodebookHealth(patience=2)
    usage = [3.0, 3.9, 2.0, 1.0, 9.0, 3.0, 3.0, 20.0]  # S = 32: S/8 = 4
    warned = []
    for value in usage:
        health.results = {"layer1": {"perplexity": value, "codebook_size": 32}}
        health.check_usage()
        warned.append(capsys.readouterr().out)
    expected_line = "warning: codebook layer1 uses 3.9 of 32 codes (< S/8) for 2 validations in a row; see docs/codebooks.md (codebook=healthy)\n"
    assert warned[1] == expected_line
    assert [bool(w) for w in warned] == [False, True, False, False, False, False, True, False]
    assert health.state_dict() == {"streaks": {"layer1": 0}}


def test_bad_options_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"patience=0"):
        CodebookHealth(patience=0)
    with pytest.raises(ValueError, match=r"dead_share=2"):
        CodebookHealth(dead_share=2.0)


# ------------------------------------------------------------------------------------------- a real run

STEPS, EVERY, PATIENCE = 8, 2, 3
COLLAPSED_RUN = [
    "experiment=smoke",
    "logger=[tensorboard,csv]",
    f"trainer.max_steps={STEPS}",
    f"trainer.val_check_interval={EVERY}",
    f"callbacks.codebook_health.patience={PATIENCE}",
    "codebook=ema",  # the official settings (smoke's healthy codebook would re-seed the dead codes)
    # codes of norm ~1000·sqrt(d): the smallest-norm code is nearest to every key, and with EMA decay 0.99 the
    # others keep their place (their sums and counts decay together): a collapsed codebook all run long
    "codebook.init_std=1000",
    *QUIET,
]


@pytest.fixture(scope="module")
def collapsed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("collapsed")
    capture = pytest.MonkeyPatch()
    lines: list[str] = []
    capture.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    try:
        result = run_train(COLLAPSED_RUN, out)
    finally:
        capture.undo()
    return out, result, "\n".join(lines)


@needs_data
def test_training_logs_validation_health_and_warns_once(
    collapsed_run: tuple[Path, dict[str, Any], str],
) -> None:
    out, _, console = collapsed_run
    steps = list(range(EVERY, STEPS + 1, EVERY))
    for layer in ("layer0", "layer1"):
        logged = {m: scalars(out, f"codebook/{layer}/val_{m}") for m in METRICS}
        assert {m: [s for s, _ in v] for m, v in logged.items()} == dict.fromkeys(METRICS, steps)
        assert all(v == 1.0 for _, v in logged["perplexity"])  # one code takes every key
        assert all(v == 31 / 32 for _, v in logged["dead_fraction"])
        assert all(v > 4 for _, v in logged["kmeans_perplexity"])  # what k-means takes from the same keys
        for (_, quant), (_, reference), (_, regret) in zip(
            logged["quant_error"], logged["kmeans_error"], logged["regret"], strict=True
        ):
            assert 0 < reference < 1 and regret > 10 and regret == pytest.approx(quant / reference, rel=1e-5)
        assert scalars(out, f"codebook/{layer}/perplexity")  # the training-time metrics are still there
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    regrets = [float(r["codebook/layer1/val_regret"]) for r in rows if r.get("codebook/layer1/val_regret")]
    assert regrets == pytest.approx([v for _, v in scalars(out, "codebook/layer1/val_regret")], rel=1e-6)

    lines = console.splitlines()
    warnings = [i for i, line in enumerate(lines) if line.startswith("warning: codebook")]
    assert [lines[i] for i in warnings] == [
        f"warning: codebook layer{n} uses 1.0 of 32 codes (< S/8) for {PATIENCE} validations in a row; "
        "see docs/codebooks.md (codebook=healthy)"
        for n in (0, 1)
    ]
    summaries = [i for i, line in enumerate(lines) if line.startswith("step ")]
    third = summaries[PATIENCE - 1]
    assert lines[third].startswith(f"step {PATIENCE * EVERY} ") and warnings == [third + 1, third + 2]


@needs_data
def test_eval_json_has_the_codebook_section(
    collapsed_run: tuple[Path, dict[str, Any], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tvq_exp.run.evaluate import evaluate

    out, _, _ = collapsed_run
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "eval",
            overrides=[
                f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}",
                "limit_batches=4",  # the smoke run's validation
                "progress_bar=false",
                f"output={tmp_path / 'eval.json'}",
            ],
        )
    evaluate(cfg)
    section = json.loads((tmp_path / "eval.json").read_text())["codebook"]
    assert list(section) == ["layer0", "layer1"]
    for layer, result in section.items():
        assert set(result) == {*METRICS, "codebook_size"} and result["codebook_size"] == 32
        for metric in METRICS:  # the same checkpoint, split, sample and seed as the last validation
            logged = scalars(out, f"codebook/{layer}/val_{metric}")[-1][1]
            assert math.isclose(result[metric], logged, rel_tol=1e-5), (layer, metric)
    parts = [
        f"{layer} 1.0/32 (k-means {section[layer]['kmeans_perplexity']:.1f}, regret {section[layer]['regret']:.2f})"
        for layer in section
    ]
    expected = f"codebook usage: {parts[0]}, {parts[1]}"
    assert capsys.readouterr().out.splitlines()[-1] == expected
