"""Bad overrides are refused when the config is composed, with one line naming the key.

Most cases compose ``train.yaml`` with ``hydra.compose`` and call :func:`tvq_exp.run.validation.validate`; a few
go through the real ``train.py`` (exit status 2, one line on stderr, no traceback, no data read).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from tests.helpers.paths import CONF, REPO
from tvq_exp.attention.registry import BACKENDS
from tvq_exp.attention.vq import VQAttention
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.options import constraints
from tvq_exp.run.schema import LIGHTNING_PRECISIONS
from tvq_exp.run.validation import Command, ConfigError, build_run, check, schema_for, validate

TINY = ["experiment=smoke"]

# (overrides, the key the message must name)
BAD_OVERRIDES: list[tuple[list[str], str]] = [
    (["model.attention.block_len=0"], "model.attention.block_len"),
    (["model.attention.block_len=-32"], "model.attention.block_len"),
    (["model.attention.block_len=128"], "model.attention.block_len"),  # > data.seq_len=64
    (["model.attention.codebook_size=1"], "model.attention.codebook_size"),
    (["model.attention.codebook_size=0"], "model.attention.codebook_size"),
    (["model.attention.window_len=64"], "model.attention.window_len"),  # > block_len=32
    (["model.attention.name=nope"], "model.attention.name"),
    (["+model.attention.causal=abc"], "model.attention.causal"),  # declared by the base class
    (["+model.block.layerdrop=1.5"], "model.block.layerdrop"),  # likewise for the blocks
    (["+model.block.key_smear=maybe"], "model.block.key_smear"),
    (["+model.attention.codebok_size=8"], "model.attention.codebok_size"),
    (["model.d_model=0"], "model.d_model"),
    (["model.n_layers=0"], "model.n_layers"),
    (["model.vocab_size=-1"], "model.vocab_size"),
    (["model.embed_dropout=1.5"], "model.embed_dropout"),
    (["model.block.d_k=0"], "model.block.d_k"),
    (["model.block.dropout=-0.1"], "model.block.dropout"),
    (["model.block.position=alibi"], "model.block.position"),
    (["model.d_model=abc"], "model.d_model"),
    (["codebook.decay=1.5"], "codebook.decay"),
    (["codebook.update=adam"], "codebook.update"),
    (["codebook.commit_weight=-1"], "codebook.commit_weight"),
    (["model=mha_talking_heads", "model/attention=vq"], "talking_heads"),
    (["model=mha_dense", "model.block.heads=0"], "model.block.heads"),
    (["model=mha_dense", "model.block.kv_heads=3"], "model.block.kv_heads"),
    (["model.block._target_=tvq_exp.blocks.Nope"], "model.block._target_"),
    (["data.seq_len=0"], "data.seq_len"),
    (["data.batch_size=0"], "data.batch_size"),
    (["+data.corpus.pth=x"], "data.corpus.pth"),
    # CUDA graphs with accumulated micro-batches (the same without accumulation: the paper preset, accepted)
    (
        ["module.compile=true", "+module.compile_mode=reduce-overhead", "trainer.accumulate_grad_batches=2"],
        "module.compile_mode",
    ),
]


def compose_train(overrides: list[str]) -> DictConfig:
    """``train.yaml`` composed with the smoke preset and ``overrides``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=[*TINY, *overrides])


def test_the_table_is_large_enough() -> None:
    assert len(BAD_OVERRIDES) >= 20


def assert_accepted(cfg: DictConfig) -> None:
    """``validate`` accepts ``cfg`` and leaves it as it was; the model it checks is the one ``cfg`` describes; and
    the same config with ``model.n_layers=0`` is refused on that key (validation ran, it did not just pass)."""
    before = OmegaConf.to_container(cfg)
    validate(cfg)
    assert OmegaConf.to_container(cfg) == before, "validate edited the config"
    model, _ = build_run(cfg, device="meta")
    assert (model.d_model, model.n_layers, len(model.blocks)) == (
        cfg.model.d_model,
        cfg.model.n_layers,
        cfg.model.n_layers,
    )
    assert {p.device.type for p in model.parameters()} == {"meta"}
    broken = copy.deepcopy(cfg)
    broken.model.n_layers = 0
    with pytest.raises(ConfigError, match=r"model\.n_layers"):
        validate(broken)


def test_the_smoke_preset_itself_is_valid() -> None:
    assert_accepted(compose_train([]))


MODEL_PRESETS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
ATTENTION_PRESETS = sorted(p.stem for p in (CONF / "model" / "attention").glob("*.yaml"))


@pytest.mark.parametrize("model", MODEL_PRESETS)
def test_every_model_preset_passes_validation(model: str) -> None:
    """Validation must accept every shipped preset: `python train.py model=NAME` may not be refused."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert_accepted(compose("train", overrides=[f"model={model}"]))


def test_schemas_follow_the_shared_options_to_the_base_class() -> None:
    """A backend or block hands its shared options on (``**shape``, ``**options``): its schema and rules are its own
    options and its base's, never the ``**`` parameter itself."""
    for target, own, shared in [
        (
            VQAttention,
            {"codebook_size", "block_len", "window_len"},
            {"d_k", "d_v", "heads", "causal", "kv_heads"},
        ),
        (
            GAUBlock,
            {"d_k", "expansion", "heads"},
            {"d_model", "attention", "position", "dropout", "layerdrop"},
        ),
    ]:
        fields = set(schema_for(target).__dataclass_fields__)
        assert own | shared <= fields and not fields & {"shape", "options"}, target
    assert {"d_k", "block_len"} <= set(constraints(VQAttention)) and "layerdrop" in constraints(GAUBlock)


@pytest.mark.parametrize("attention", ATTENTION_PRESETS)
def test_every_attention_preset_passes_validation_in_both_blocks(attention: str) -> None:
    """Every ``conf/model/attention`` preset (a new backend's YAML included) makes a valid model with either block,
    with the XL bias where its class takes one (else RoPE)."""
    name = OmegaConf.load(CONF / "model" / "attention" / f"{attention}.yaml").name
    position = "xl" if BACKENDS[name].supports_position_bias else "rope"
    for model in ("gau_dense", "mha_dense"):
        assert_accepted(
            compose_train(
                [f"model={model}", f"model/attention={attention}", f"model.block.position={position}"]
            )
        )


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_passes_validation(experiment: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert_accepted(compose("train", overrides=[f"experiment={experiment}"]))


@pytest.mark.parametrize("override", ["model/attention=dense", "model/attention=flash_chunk"])
def test_flash_window_defaults_but_dense_window_is_required(override: str) -> None:
    cfg = compose_train(["model=gau_dense", override, "model.attention.window_len=null"])
    if override.endswith("dense"):
        with pytest.raises(ConfigError, match="model.attention.window_len"):
            validate(cfg)
    else:
        assert_accepted(cfg)


@pytest.mark.parametrize(("overrides", "key"), BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_names_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_train(overrides))
    message = str(error.value)
    assert key in message, message
    assert "\n" not in message


def test_a_bad_codebook_option_is_named_as_typed() -> None:
    """The VQ attention reads the top-level codebook group (``model.attention.codebook: ${codebook}``): a bad value
    is named by the key the user sets, ``codebook.<option>``."""
    with pytest.raises(ConfigError) as error:
        validate(compose_train(["model=gau_vq", "codebook.decay=1.5"]))
    assert str(error.value) == "codebook.decay=1.5: must be in (0, 1)"
    validate(
        compose_train(["model=gau_dense", "codebook=healthy"])
    )  # other backends have no codebook to check


def run_script(script: str, *overrides: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``overrides`` (outputs under ``tmp_path``)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(REPO / script), *overrides, f"paths.log_dir={tmp_path}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["experiment=smoke", "model.attention.codebook_size=1"], "model.attention.codebook_size"),
        (["experiment=smoke", "model.attention.codebok_size=8"], "codebok_size"),  # not in the config
        (["experiment=smoke", "model=nope"], "model"),  # unknown group option
        (["experiment=smoke", "trainer.max_stepz=5"], "did you mean trainer.max_steps?"),  # no second error
        (["experiment=smoke", "torch_thread=1"], "did you mean torch_threads?"),
    ],
)
def test_train_script_prints_one_line_and_exits_2(overrides: list[str], key: str, tmp_path: Path) -> None:
    result = run_script("train.py", *overrides, tmp_path=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_eval_script_refuses_a_missing_checkpoint_in_one_line(tmp_path: Path) -> None:
    result = run_script("eval.py", f"ckpt_path={tmp_path / 'none.ckpt'}", tmp_path=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "none.ckpt" in lines[0], result.stderr


# A refusal that imports Lightning costs ~7 s of a 9 s wait (issue 26): train.py refuses a bad model, command or
# guard value before it. The script runs the real entry point and reports what was imported when it exited.
REFUSAL = """
import runpy, sys
script = sys.argv[1]
sys.argv = [script, *sys.argv[2:]]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as stop:
    print(stop.code, *(name in sys.modules for name in ("lightning", "tvq_exp.run.build", "torch._dynamo")))
"""


def refusal(script: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    """Run the entry point ``script`` with ``overrides`` as a user would; stdout says what was imported: Lightning,
    the builder and ``torch._dynamo`` (2.5 s to import) wait until the command line is known to be good."""
    return subprocess.run(
        [sys.executable, "-c", REFUSAL, script, *overrides],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "override",
    [
        "model.attention.codebook_size=abc",
        "model.block.dropout=2",
        "+model.attention.codebok_size=8",
        "seed=-1",
        "torch_threads=0",
        "guard.max_bad_steps=abc",
    ],
)
def test_train_refuses_a_bad_value_before_importing_lightning(override: str, tmp_path: Path) -> None:
    result = refusal("train.py", "experiment=smoke", override, f"paths.log_dir={tmp_path}")
    assert result.stdout.split() == ["2", "False", "False", "False"], result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    "script,override,key",
    [
        ("eval.py", "split=train", "split"),
        ("eval.py", "limit_batches=0", "limit_batches"),
        ("sample.py", "num_samples=0", "num_samples"),
        ("sample.py", "top_p=1.5", "top_p"),
    ],
)
def test_eval_and_sample_refuse_a_bad_value_before_importing_lightning(
    script: str, override: str, key: str, tmp_path: Path
) -> None:
    result = refusal(script, f"ckpt_path={tmp_path / 'none.ckpt'}", override)
    assert result.stdout.split() == ["2", "False", "False", "False"], result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}="), result.stderr


def test_lightning_precisions_are_written_out_as_lightning_has_them() -> None:
    """schema.py writes Lightning's precision names out (importing them would import Lightning)."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT_STR

    assert LIGHTNING_PRECISIONS == typing.get_args(_PRECISION_INPUT_STR)


def test_the_command_decides_which_options_are_checked() -> None:
    """The validator is told the command: a train config checked as eval.py's is refused on its first train-only
    key, and ``check`` builds nothing (a rule between options waits for ``build_run``)."""
    cfg = compose_train(["model.attention.window_len=64"])  # > block_len=32: the constructor's rule
    check(cfg, Command.TRAIN)  # types and ranges only: passes
    with pytest.raises(ConfigError, match="model.attention.window_len=64: must be <= block_len=32"):
        validate(cfg, Command.TRAIN)
    with pytest.raises(ConfigError, match="unknown option"):
        check(cfg, Command.EVAL)


class _Stop(Exception):
    """Raised in place of training: the test needs only what train() does before the first step."""


def test_train_checks_once_and_builds_the_model_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The command validates once (check) and builds the model once, for real (build_run): no second
    validation after a config is resolved, no meta-device copy built and thrown away."""
    import functools

    import lightning as L

    import tvq_exp.run.train as train_command
    from tvq_exp.models.decoder import Decoder

    counts = {"check": 0, "decoder": 0}
    original_check, original_init = train_command.check, Decoder.__init__

    def counting_check(*args: object) -> None:
        counts["check"] += 1
        original_check(*args)

    @functools.wraps(original_init)
    def counting_init(self: Decoder, *args: object, **kwargs: object) -> None:
        counts["decoder"] += 1
        original_init(self, *args, **kwargs)

    def stop(*args: object, **kwargs: object) -> None:
        raise _Stop

    monkeypatch.setattr(train_command, "check", counting_check)
    monkeypatch.setattr(Decoder, "__init__", counting_init)
    monkeypatch.setattr(L.Trainer, "fit", stop)
    cfg = compose_train(["logger=none", "callbacks=none", f"paths.output_dir={tmp_path}"])
    with pytest.raises(_Stop):
        train_command.train(cfg)
    assert counts == {"check": 1, "decoder": 1}
