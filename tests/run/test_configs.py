"""The Hydra config tree: every model x data combination composes and instantiates; presets hold their values."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from tests.helpers.paths import CONF
from tvq_exp.models.module import AutoregressiveLitModule as LanguageModel
from tvq_exp.run.build import (  # registers the tvq.* resolvers
    build_callbacks,
    build_loggers,
    build_module,
    to_dict,
)
from tvq_exp.run.validation import validate

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))
DATA_PLACEHOLDERS = {"text_files": ["data.corpus.path=some/folder"], "hf": ["data.corpus.path=some/dataset"]}


def compose_train(
    overrides: list[str], output_dir: Path | str = "/tmp/unused", hydra: bool = False
) -> DictConfig:
    """Compose ``conf/train.yaml`` with ``overrides`` (the run dir replaced by ``output_dir``)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        extra = [] if hydra else [f"paths.output_dir={output_dir}"]
        return compose("train", overrides=[*overrides, *extra], return_hydra_config=hydra)


def test_presets_exist() -> None:
    assert {"gau_dense", "gau_vq", "mha_dense", "mha_vq", "tiny"} <= set(MODELS)
    assert {"gutenberg", "enwik8", "mnist", "digits"} <= set(DATA)
    for group, names in {
        "trainer": {"default", "cpu", "gpu", "ddp", "ddp_cpu"},
        "logger": {"tensorboard", "csv", "none"},
        "callbacks": {"default", "none"},
        "experiment": {"cpu_small", "enwik8_paper", "smoke"},
    }.items():
        assert names <= {p.stem for p in (CONF / group).glob("*.yaml")}, group


def test_default_is_gau_vq_on_enwik8() -> None:
    cfg = compose_train([])
    assert cfg.model.attention.name == "vq"
    assert cfg.model.block._target_.endswith("GAUBlock")
    assert cfg.data.corpus.name == "enwik8"
    assert cfg.module.max_steps == cfg.trainer.max_steps
    assert (cfg.data.sampler, cfg.data.eval_protocol) == ("random", "segment")  # fresh state per window


@pytest.mark.parametrize("model", MODELS)
def test_every_model_and_data_combination_instantiates(model: str) -> None:
    for data in DATA:
        small = ["model.n_layers=1", "model.d_model=32"]
        cfg = compose_train([f"model={model}", f"data={data}", *small, *DATA_PLACEHOLDERS.get(data, [])])
        datamodule = instantiate(cfg.data)
        assert datamodule.vocab_size == cfg.data.vocab_size and datamodule.kind == cfg.data.kind
        decoder = instantiate(cfg.model)
        assert decoder.vocab_size == cfg.data.vocab_size
        assert (len(decoder.quantizers()) > 0) == (cfg.model.attention.name == "vq")
        module = build_module(to_dict(cfg))
        assert isinstance(module, LanguageModel) and module.kind == cfg.data.kind


def test_stream_sampler_bounds_the_carried_state_by_default() -> None:
    cfg = compose_train(["data=gutenberg", "data.sampler=stream"])
    assert cfg.data.reset_every == 8192 and instantiate(cfg.data).context_len == 8192


@pytest.mark.parametrize("trainer", ["default", "cpu", "gpu", "ddp", "ddp_cpu", "fsdp", "fsdp_cpu"])
def test_trainer_presets(trainer: str) -> None:
    cfg = compose_train([f"trainer={trainer}"])
    t = cfg.trainer
    assert t.gradient_clip_val is None and t.num_sanity_val_steps == 0
    expected = {
        "cpu": "32-true",
        "ddp_cpu": "32-true",
        "gpu": "bf16-mixed",
        "ddp": "bf16-mixed",
        "fsdp": "32-true",
    }
    if trainer in expected:
        assert t.precision == expected[trainer]
    if trainer.startswith("ddp"):
        assert t.strategy == "ddp"
    if trainer.startswith("fsdp"):
        assert (
            t.strategy._target_ == "tvq_exp.run.fsdp.BlockFSDPStrategy"
            and t.strategy.activation_checkpointing
        )
        assert t.strategy.param_dtype == ("fp32" if trainer == "fsdp_cpu" else "bf16")


def test_cpu_trainer_loggers_and_callbacks_instantiate(tmp_path: Path) -> None:
    for logger in ("tensorboard", "csv", "none"):
        for callbacks in ("default", "none"):
            cfg = compose_train([f"logger={logger}", f"callbacks={callbacks}", "trainer=cpu"], tmp_path)
            loggers, cbs = build_loggers(cfg), build_callbacks(cfg)
            assert len(loggers) == (0 if logger == "none" else 1)
            assert len(cbs) == len(cfg.callbacks or {})
            trainer = instantiate(cfg.trainer, callbacks=cbs, logger=loggers or False)
            assert trainer.max_steps == cfg.trainer.max_steps
    cfg = compose_train(["trainer.enable_progress_bar=false"], tmp_path)
    assert len(build_callbacks(cfg)) == len(cfg.callbacks) - 1  # no progress bar


def test_enwik8_paper_hyperparameters() -> None:
    cfg = compose_train(["experiment=enwik8_paper"])
    m, d, t, o = cfg.model, cfg.data, cfg.trainer, cfg.module
    assert (m.n_layers, m.d_model, m.block.d_k) == (48, 768, 128)
    assert (m.attention.name, m.attention.codebook_size, m.attention.block_len) == ("vq", 512, 512)
    assert (m.block.dropout, m.block.layerdrop, m.block.sinusoid_dropout) == (0.5, 0.3, 0.2)
    assert (m.tie_embeddings, m.final_norm, m.head_bias, m.logit_scale, m.init) == (
        False,
        False,
        True,
        1.0,
        "official",
    )
    # TBPTT: sequences of 8192 in updates of 2048, 128 sequences per update over 8 processes
    assert (d.corpus.name, d.sampler, d.sequence_len, d.seq_len, d.eval_protocol) == (
        "enwik8",
        "tbptt",
        8192,
        2048,
        "sequence",
    )
    assert d.batch_size * t.devices == cfg.global_batch_size == 128 and t.accumulate_grad_batches == 1
    assert (o.lr, o.warmup_steps, o.grad_clip, o.weight_decay, o.weight_decay_mode) == (
        4e-4,
        10000,
        0.1,
        2e-4,
        "official",
    )
    assert (t.max_steps, o.max_steps, t.precision) == (125000, 125000, "bf16-mixed")
    # compiled by blocks, replayed from CUDA graphs (117-120k tokens/s on one H200 against 95.8k launched by the host)
    assert (o.compile_scope, o.compile_mode) == ("blocks", "reduce-overhead")
    # the paper's AdamW settings are the constructor's defaults (the one source): the preset does not repeat them
    signature = inspect.signature(inspect.unwrap(LanguageModel.__init__)).parameters
    effective = {name: o.get(name, p.default) for name, p in signature.items()}
    assert list(effective["betas"]) == [0.9, 0.98] and effective["eps"] == 1e-9
    assert effective["min_lr_ratio"] == 0.1 and "betas" not in o


def test_cpu_small_vq_and_dense_have_the_same_size() -> None:
    counts = {}
    for model in ("gau_vq", "gau_dense"):
        cfg = compose_train(["experiment=cpu_small", f"model={model}"])
        assert cfg.data.corpus._target_.endswith("GutenbergCorpus") and cfg.trainer.accelerator == "cpu"
        decoder = instantiate(cfg.model)
        counts[model] = sum(p.numel() for p in decoder.parameters())
    assert counts["gau_vq"] == counts["gau_dense"]
    assert 1e5 < counts["gau_vq"] < 5e6


def test_smoke_experiment_is_tiny() -> None:
    cfg = compose_train(["experiment=smoke"])
    assert cfg.trainer.max_steps <= 50 and cfg.model.d_model <= 64 and cfg.trainer.accelerator == "cpu"


@pytest.mark.parametrize("attention", sorted(p.stem for p in (CONF / "model" / "attention").glob("*.yaml")))
def test_tiny_model_takes_every_attention_preset(attention: str) -> None:
    """conf/model/tiny.yaml says to switch its backend with ``model/attention=...``: every preset validates
    (tiny pinned VQ's codebook_size and block_len, which linear and dense refuse), keeping tiny's sizes."""
    position = ["model.block.position=rope"] if attention == "linear" else []  # linear has no XL bias
    cfg = compose_train(["experiment=smoke", f"model/attention={attention}", *position])
    validate(cfg)
    assert (cfg.model.attention.name, cfg.model.d_model, cfg.block_len) == (attention, 64, 32)


@pytest.mark.parametrize("data", ["digits", "mnist", "cifar10", "gutenberg", "mqar"])
def test_best_checkpoint_is_named_after_the_datas_bits_metric(data: str) -> None:
    """Image runs report bits per dim: their best checkpoint says ``bpd``, a text (or probe) run's ``bpb``."""
    cfg = compose_train(["experiment=smoke", f"data={data}"])
    unit = "bpd" if cfg.data.kind == "image" else "bpb"
    assert cfg.callbacks.model_checkpoint.filename == f"best-step{{step:07d}}-{unit}{{val/bpb:.4f}}"


def test_run_dirs_are_unique_within_one_second() -> None:
    dirs = [compose_train([], hydra=True).hydra.run.dir for _ in range(5)]
    assert len(set(dirs)) == 5
    assert all(d.startswith("logs/runs/") for d in dirs)
    cfg = compose_train([], hydra=True)
    first = cfg.hydra.run.dir
    assert re.fullmatch(r"logs/runs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", first)
    # ``${tvq.uid:}`` (and ``${now:}``) resolve once per config: every later read, and the sweep dir, see the same
    assert [cfg.hydra.run.dir for _ in range(3)] == [first] * 3
    assert cfg.hydra.sweep.dir == "logs/multiruns/" + first.removeprefix("logs/runs/")


def test_dense_carried_memory_is_one_segment() -> None:
    """Stream training carries the state: dense attention keeps one segment of keys (Transformer-XL
    memory), so a step never costs more than two segments, however far into the stream."""
    import torch

    cfg = compose_train(
        ["model=gau_dense", "data=shakespeare", "data.seq_len=16", "model.d_model=32", "model.n_layers=1"]
    )
    assert cfg.model.attention.memory_len == 16
    model = instantiate(cfg.model)
    state = None
    for _ in range(3):
        state = model(torch.randint(0, 256, (2, 16)), state).state
    assert state[0].attn.k.shape[2] == 16 and state[0].attn.position == 48
