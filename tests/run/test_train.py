"""Training: a real run on the Gutenberg books, resume, gradient accumulation, optimiser set-up, dense -> VQ."""

from __future__ import annotations

import functools
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.paths import CONF
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.dense_to_vq import collect_keys, init_from_dense, load_dense_weights
from tvq_exp.models.module import AutoregressiveLitModule as LanguageModel
from tvq_exp.models.optim import warmup_cosine
from tvq_exp.run.build import build_module, to_dict
from tvq_exp.run.checkpoints import read_weights
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.train import train

TINY = ["model.d_model=64", "model.n_layers=2", "model.block.d_k=32"]
TINY_VQ = [*TINY, "model.attention.codebook_size=32", "model.attention.block_len=32"]
QUIET = ["trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.precision=32-true"]
# The real-corpus run: 400 steps of 32 x 64 bytes, validation on the first 16 segments of 32 streams.
REAL_RUN = [
    "data=gutenberg",
    "data.seq_len=64",
    "data.batch_size=32",
    "data.eval_batch_size=32",
    "trainer.max_steps=400",
    "trainer.val_check_interval=200",
    "trainer.limit_val_batches=16",
    "trainer.log_every_n_steps=25",
    "module.lr=5e-3",
    "module.warmup_steps=30",
    "module.weight_decay=0.01",
    *QUIET,
]

needs_data = pytest.mark.needs_data("text/gutenberg")


def run_train(overrides: list[str], output_dir: Path) -> dict[str, Any]:
    """Compose ``train.yaml`` with ``overrides`` and train into ``output_dir``."""
    overrides = [*overrides, f"paths.output_dir={output_dir}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    laid = [o for o in overrides if not o.startswith("experiment=")]  # a ckpt_path run lays keys, not presets
    return train(cfg, laid)


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of a TensorBoard scalar written under ``run_dir``."""
    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event files under {run_dir}"
    values: list[tuple[int, float]] = []
    for path in events:
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [(e.step, e.value) for e in acc.Scalars(tag)]
    return values


@pytest.fixture(scope="module")
def vq_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], float]:
    out = tmp_path_factory.mktemp("vq_run")
    start = time.perf_counter()
    result = run_train(["model=gau_vq", *TINY_VQ, *REAL_RUN], out)
    return out, result, time.perf_counter() - start


# ------------------------------------------------------------------------------------------- real training


@needs_data
def test_real_training_lowers_val_bpb_and_logs_to_tensorboard(
    vq_run: tuple[Path, dict[str, Any], float],
) -> None:
    out, result, seconds = vq_run
    bpb = scalars(out, "val/bpb")
    print(f"\ngau_vq tiny: val/bpb {[(s, round(v, 4)) for s, v in bpb]} in {seconds:.0f}s")
    assert [s for s, _ in bpb] == [200, 400]
    assert bpb[-1][1] < 3.5 and bpb[-1][1] < bpb[0][1]
    assert result["global_step"] == 400 and math.isclose(result["val"]["bpb"], bpb[-1][1], rel_tol=1e-6)
    for tag in ("train/loss", "train/bpb", "train/aux_loss", "lr/lr", "val/loss", "throughput/tokens_per_s"):
        assert scalars(out, tag), tag
    perplexity = scalars(out, "codebook/layer0/perplexity")
    assert len(perplexity) == 400 // 25 and all(1.0 <= v <= 32.0 for _, v in perplexity)
    assert scalars(out, "codebook/layer1/quant_error") and scalars(out, "codebook/layer0/commit_loss")
    assert (out / "config.yaml").is_file() and (out / "checkpoints" / "last.ckpt").is_file()
    assert Path(result["best_ckpt"]).name.startswith("best-step0000400")


@needs_data
def test_eval_reproduces_the_logged_val_bpb(
    vq_run: tuple[Path, dict[str, Any], float], tmp_path: Path
) -> None:
    out, result, _ = vq_run
    logged = scalars(out, "val/bpb")[-1][1]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "eval",
            overrides=[
                f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}",
                "limit_batches=16",
                "progress_bar=false",
            ],
        )
    evaluated = evaluate(cfg)
    assert abs(evaluated["bpb"] - logged) < 1e-5
    assert evaluated["tokens"] == 16 * 32 * 64 and evaluated["global_step"] == 400
    written = json.loads((out / "checkpoints" / "eval-last-val-segment-limit16.json").read_text())
    assert (
        written["limit_batches"] == 16 and not (out / "checkpoints" / "eval-last-val-segment.json").exists()
    )


@needs_data
def test_dense_training_on_the_same_run(tmp_path: Path) -> None:
    start = time.perf_counter()
    result = run_train(["model=gau_dense", *TINY, *REAL_RUN], tmp_path)
    print(f"\ngau_dense tiny: val/bpb {result['val']['bpb']:.4f} in {time.perf_counter() - start:.0f}s")
    assert result["val"]["bpb"] < 3.5 and not scalars(tmp_path, "codebook/layer0/perplexity")


# ------------------------------------------------------------------------------------------- resume

SMOKE = ["experiment=smoke", "data=shakespeare", "data.seq_len=64", "data.sampler=stream", *QUIET]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@needs_data
@pytest.mark.parametrize("codebook", ["healthy", "sampled"])  # sampled: its draws and annealing resume too
def test_resume_continues_steps_optimizer_and_weights(tmp_path: Path, codebook: str) -> None:
    n = 6
    common = [*SMOKE, f"codebook={codebook}", f"trainer.val_check_interval={n}"]
    common.append("trainer.log_every_n_steps=2")
    # the first run stops half-way through the 2n-step schedule of the other two
    first = run_train([*common, f"trainer.max_steps={n}", f"module.max_steps={2 * n}"], tmp_path / "a")
    resumed = run_train(
        [*common, f"trainer.max_steps={2 * n}", f"ckpt_path={first['last_ckpt']}"], tmp_path / "b"
    )
    straight = run_train([*common, f"trainer.max_steps={2 * n}"], tmp_path / "c")

    ckpt_a = torch.load(first["last_ckpt"], map_location="cpu", weights_only=False)
    ckpt_b = torch.load(resumed["last_ckpt"], map_location="cpu", weights_only=False)
    assert ckpt_a["global_step"] == n and ckpt_b["global_step"] == 2 * n and resumed["global_step"] == 2 * n
    steps = {int(s["step"]) for s in ckpt_b["optimizer_states"][0]["state"].values()}
    assert steps == {2 * n}
    assert ckpt_b["lr_schedulers"][0]["last_epoch"] == 2 * n
    assert (
        ckpt_a["train_state"] is not None
        and ckpt_b["train_state"][0]["position"] > ckpt_a["train_state"][0]["position"]
    )
    a, b, c = _weights(first["last_ckpt"]), _weights(resumed["last_ckpt"]), _weights(straight["last_ckpt"])
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in b:  # resuming equals never stopping
        torch.testing.assert_close(b[k], c[k], rtol=1e-5, atol=1e-6, msg=k)
    assert scalars(tmp_path / "b", "train/loss")[0][0] > n  # the resumed run logs from step n on


# ------------------------------------------------------------------------------------------- accumulation


@needs_data
def test_codebook_step_once_per_optimizer_step_with_accumulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = Decoder.codebook_step

    def counted(self: Decoder, apply: torch.Tensor | None = None) -> None:
        calls.append(1)
        original(self, apply)

    monkeypatch.setattr(Decoder, "codebook_step", counted)
    batches: list[int] = []
    monkeypatch.setattr(
        LanguageModel, "on_train_batch_start", lambda self, batch, batch_idx: batches.append(batch_idx)
    )
    result = run_train(
        # accumulation sums independent windows (refused for carried streams, whose batches continue each other)
        [
            *SMOKE,
            "data.sampler=random",
            "trainer.max_steps=4",
            "trainer.accumulate_grad_batches=3",
            "trainer.val_check_interval=12",
        ],
        tmp_path,
    )
    assert result["global_step"] == 4 and len(batches) == 12 and len(calls) == 4


# ------------------------------------------------------------------------------------------- optimiser


def _module(strategy: str = "ema", **options: Any) -> LanguageModel:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "model=gau_vq",
                *TINY_VQ,
                f"codebook={strategy}",
                "paths.output_dir=/tmp/x",
            ],
        )
    config = to_dict(cfg)
    config["module"].update(options)
    return build_module(config)


def test_weight_decay_only_on_weight_matrices() -> None:
    module = _module("gradient", weight_decay=0.1)
    decay, no_decay = module.parameter_groups()
    names = {id(p): n for n, p in module.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decayed and all(module.model.get_parameter(n).dim() == 2 for n in decayed)
    assert not any("quantizer" in n or "norm" in n or "embed" in n for n in decayed)
    assert any(n.endswith("quantizer.embed") for n in (names[id(p)] for p in no_decay["params"]))
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(module.model.parameters()))


def test_gradient_clipping_skips_the_codebook() -> None:
    module = _module("gradient", grad_clip=0.5)
    for p in module.model.parameters():
        p.grad = torch.full_like(p, 10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        module.configure_gradient_clipping(torch.optim.SGD(module.parameters(), lr=0.1))
    codebook = {id(p) for q in module.model.quantizers() for p in q.parameters()}
    assert codebook
    others = [p.grad for p in module.model.parameters() if id(p) not in codebook]
    assert math.isclose(
        torch.linalg.vector_norm(torch.cat([g.flatten() for g in others])).item(), 0.5, rel_tol=1e-4
    )
    assert all(torch.all(p.grad == 10.0) for p in module.model.parameters() if id(p) in codebook)


def test_warmup_cosine_schedule() -> None:
    s = functools.partial(warmup_cosine, warmup_steps=10, max_steps=110, min_ratio=0.1)
    assert math.isclose(s(0), 0.1) and math.isclose(s(9), 1.0) and math.isclose(s(10), 1.0)
    assert math.isclose(s(60), 0.55) and math.isclose(s(110), 0.1) and math.isclose(s(500), 0.1)
    assert all(s(i) >= s(i + 1) for i in range(10, 200))


# ------------------------------------------------------------------------------------------- dense -> VQ


def quantisation_error(keys: torch.Tensor, codebook: torch.Tensor) -> float:
    """Mean squared distance of ``keys (H, N, d)`` to their nearest code in ``codebook (H, S, d)``."""
    return torch.cdist(keys, codebook).min(-1).values.pow(2).mean().item()


@needs_data
def test_init_from_dense_loads_weights_and_kmeans_codebooks(tmp_path: Path) -> None:
    dense = run_train(
        ["model=gau_dense", *TINY, *SMOKE, "trainer.max_steps=4", "trainer.val_check_interval=4"],
        tmp_path / "d",
    )
    dense_weights = {k[len("model.") :]: v for k, v in _weights(Path(dense["last_ckpt"])).items()}

    vq = _module().model
    random_codebooks = [q.codebook.clone() for q in vq.quantizers()]
    batches = [{"input": torch.randint(0, 256, (4, 64))} for _ in range(3)]
    init_from_dense(vq, read_weights(dense["last_ckpt"]), iter(batches), num_batches=2)
    for name, value in vq.state_dict().items():
        if ".quantizer." not in name:
            torch.testing.assert_close(value, dense_weights[name], msg=name)
    keys = collect_keys(vq, batches[:2])
    for q, k, before in zip(vq.quantizers(), keys, random_codebooks, strict=True):
        assert k.shape == (1, 2 * 4 * 64, 32) and bool(q.initialized)
        assert quantisation_error(k, q.codebook) < 0.8 * quantisation_error(k, before)

    wrong = _module().model
    with pytest.raises(ValueError, match="does not match"):
        load_dense_weights(wrong, {k: v for k, v in dense_weights.items() if "w_o" not in k})

    # into a model without quantisers (the dense control of a converted run): the weights alone, every one of them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["model=gau_dense", *TINY, *SMOKE, "paths.output_dir=/tmp/x"])
    again = build_module(to_dict(cfg)).model
    init_from_dense(again, read_weights(dense["last_ckpt"]), iter(batches), num_batches=2)
    assert again.state_dict().keys() == dense_weights.keys()
    for name, value in again.state_dict().items():
        torch.testing.assert_close(value, dense_weights[name], msg=name)

    converted = run_train(
        [
            "model=gau_vq",
            *TINY_VQ,
            *SMOKE,
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            f"init_from={dense['last_ckpt']}",
        ],
        tmp_path / "v",
    )
    val = converted["val"]
    assert converted["global_step"] == 2
    assert val == json.loads((tmp_path / "v" / "finished.json").read_text())["val"]
    assert scalars(tmp_path / "v", "val/bpb") == [(2, pytest.approx(val["bpb"], rel=1e-6))]
    assert math.isclose(
        val["bpb"], val["loss"] / math.log(2), rel_tol=1e-5
    )  # bits per byte from nats per byte
    buckets = val["position_buckets"]
    assert sum(b["tokens"] for b in buckets) == val["tokens"]
    assert math.isclose(
        sum(b["bpb"] * b["tokens"] for b in buckets) / val["tokens"], val["bpb"], rel_tol=1e-5
    )
    # The converted model starts from the dense weights (7.886 bits after 4 steps): it stays near them, clear of
    # the 8 bits of uniform bytes that a fresh model starts from (7.855 here, deterministic on CPU).
    assert abs(val["bpb"] - dense["val"]["bpb"]) < 0.1 and val["bpb"] < 8 - 0.05


@needs_data
@pytest.mark.slow
def test_cpu_small_vq_within_a_tenth_of_a_bit_of_dense(tmp_path: Path) -> None:
    """``experiment=cpu_small``: GAU-VQ ends within 0.1 bits/byte of the same-size dense GAU (same data).
    About 20 minutes on 2 CPU cores (``make test-slow``)."""
    bpb = {}
    for model in ("gau_vq", "gau_dense"):
        result = run_train(["experiment=cpu_small", f"model={model}", *QUIET], tmp_path / model)
        bpb[model] = result["val"]["bpb"]
    print(f"\ncpu_small val/bpb: {bpb}")
    assert abs(bpb["gau_vq"] - bpb["gau_dense"]) < 0.1


@pytest.mark.slow
def test_recall_cpu_keeps_its_codebooks_alive(tmp_path: Path) -> None:
    """Issue 24's health target: ``experiment=recall_cpu`` (S = 64, 2 layers) with the CPU presets' default
    codebook strategy uses at least S/4 codes (usage perplexity over the validation keys) in every layer at step
    300. The official EMA settings collapse to 2.4 / 1.2 codes here (docs/codebooks.md). About 2 minutes."""
    run_train(["experiment=recall_cpu", "trainer.max_steps=300", "trainer.val_check_interval=300", *QUIET],
              tmp_path)  # fmt: skip
    usage = {layer: scalars(tmp_path, f"codebook/layer{layer}/val_perplexity") for layer in (0, 1)}
    print(f"\nrecall_cpu usage perplexity at step 300: {usage}")
    for layer, values in usage.items():
        step, perplexity = values[-1]
        assert step == 300 and perplexity >= 64 / 4, (layer, values)


def test_image_data_logs_bits_per_dim(tmp_path: Path) -> None:
    result = run_train(
        ["experiment=smoke", "data=digits", "trainer.max_steps=4", "trainer.val_check_interval=4"]
        + ["trainer.limit_val_batches=null", "trainer.log_every_n_steps=1", *QUIET],
        tmp_path,
    )
    val = result["val"]
    assert val["bpd"] == val["bpb"] and val["tokens"] == 180 * 64
    assert scalars(tmp_path, "val/bpd") == scalars(tmp_path, "val/bpb") and scalars(tmp_path, "train/bpd")


def test_official_weight_decay_is_not_scaled_by_the_learning_rate() -> None:
    """``weight_decay_mode=official``, hand-computed for one step: the official update is
    ``p <- p - lr·s(t)·update - wd·p``; Adam's first update is ``g / (|g| + eps) = sign(g)``, the schedule's
    ``s(0) = 1`` without warmup, so ``p1 = (1 - wd)·p0 - lr·sign(g0)`` for every decayed tensor (embeddings too)."""
    import copy

    import lightning as L

    from tvq_exp.attention import build_attention
    from tvq_exp.models.blocks import GAUBlock
    from tvq_exp.models.decoder import Decoder
    from tvq_exp.models.module import AutoregressiveLitModule

    torch.manual_seed(0)
    attention = functools.partial(build_attention, "dense", window_len=4)
    model = Decoder(256, 16, 1, functools.partial(GAUBlock, d_k=8), attention, tie_embeddings=False)
    lr, wd = 1e-2, 0.1
    module = AutoregressiveLitModule(
        model, lr=lr, weight_decay=wd, weight_decay_mode="official", max_steps=10
    )
    x = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = {"input": x[:, :-1], "target": x[:, 1:], "reset": torch.ones(2, dtype=torch.bool)}

    reference = copy.deepcopy(model)
    out = reference(batch["input"])
    nats = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["target"].flatten())
    (nats + out.aux["loss"]).backward()
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}
    grads = {n: p.grad for n, p in reference.named_parameters()}

    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    for name, p in model.named_parameters():
        if p.dim() == 1:  # vectors (norm gains, biases) are not decayed
            continue
        g = grads[name]
        sure = (g == 0) | (g.abs() > 1e-4)  # Adam's first update is sign(g) to 1e-5 where |g| >> eps (1e-9)
        expected = (1 - wd) * before[name] - lr * torch.sign(g)
        assert sure.float().mean() > 0.5, name
        torch.testing.assert_close(p.detach()[sure], expected[sure], rtol=0, atol=1e-6, msg=name)
    embedding = model.embed.weight.detach()  # decayed too, by wd itself, not lr·wd
    assert not torch.allclose(
        embedding, before["embed.weight"] - lr * torch.sign(grads["embed.weight"]), atol=1e-4
    )
