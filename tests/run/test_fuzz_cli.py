"""Fuzzing the command lines of ``train.py``, ``eval.py`` and ``sample.py`` through their real entry points
(:func:`tvq_exp.run.errors.run`, in this process): generated bad inputs of every class the audit of issue 41 found
(unknown and misspelt keys, keys a preset leaves out, wrong types and shapes, non-finite and huge numbers, unknown
group options, malformed overrides and interpolations, keys set through a whole group, contradicting run options,
options that would train nothing or never end). Each must exit non-zero with exactly one ``error:`` line on stderr,
no traceback, no "did you mean K?" naming K itself, and leave no run dir behind (docs/reliability.md, "Every bad
input gets one line"). ``tests/run/test_fuzz.py`` draws the schema's own rules, in-process, without the CLI.
"""

from __future__ import annotations

import importlib.util
import math
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hydra.core.global_hydra import GlobalHydra

from tests.helpers.paths import REPO
from tests.run.conftest import QUIET
from tvq_exp.options import constraints
from tvq_exp.run import schema
from tvq_exp.run.errors import run

TRAIN = ["experiment=smoke", "data=shakespeare", "trainer.max_steps=1", "trainer.limit_val_batches=1", *QUIET]
TRAIN_NUMBERS = {
    "module.lr": float, "module.weight_decay": float, "module.eps": float, "module.warmup_steps": int,
    "module.grad_clip": float, "module.min_lr_ratio": float, "model.d_model": int, "model.n_layers": int,
    "model.block.heads": int, "model.block.d_k": int, "model.block.dropout": float, "model.attention.block_len": int,
    "model.attention.codebook_size": int, "data.seq_len": int, "data.batch_size": int, "data.eval_batch_size": int,
    "trainer.max_steps": int, "trainer.val_check_interval": float, "trainer.log_every_n_steps": int,
    "trainer.accumulate_grad_batches": int, "codebook.decay": float, "codebook.commit_weight": float, "seed": int,
    "guard.max_bad_steps": int,
}  # fmt: skip
PER_NUMBER = 4
NON_NUMBERS = ["nan", "inf", "-inf", "1e400", "abc", "[1,2]", "{a:1}", "''", "null"]
TYPOS = {  # a misspelt key of each area, without and with +
    "module.lrr": "module.lr", "trainer.max_step": "trainer.max_steps", "model.d_modle": "model.d_model",
    "data.seq_ln": "data.seq_len", "model.block.head": "model.block.heads", "guard.max_bad_step": "guard.max_bad_steps",
    "seeed": "seed", "codebook.decy": "codebook.decay",
}  # fmt: skip
GROUPS = [
    "model",
    "data",
    "trainer",
    "experiment",
    "logger",
    "callbacks",
    "codebook",
    "model/attention",
    "debug",
]
MALFORMED = [
    "model.d_model", "=5", "model..d_model=1", "module.lr=${nope}", "module.lr=${oc.env:NO_SUCH_VARIABLE_OF_TVQ}",
    "trainer.max_steps=${trainer.max_steps}", "seed=${now:%H}x", "+module=3", "~model", "model.block=3",
    "module.lr=1=2", "module.lr=[", "'module.lr'=1", "+trainer.max_steps=5",
]  # fmt: skip
RUN_OPTIONS = [
    "resume=auto", "resume=maybe", "run_name=../x", "run_name=.hidden", "run_name=a/b", "ckpt_path=/no/such.ckpt",
    "init_from=/no/such.ckpt", "+trainer.max_epochs=0", "+trainer.max_epochs=-2", "trainer.max_steps=0",
    "trainer.max_steps=-1", "+module.betas=[0.9,nan]", "+module.betas=[0.9]", "+module.betas=[2,0.5]",
    "callbacks.model_checkpoint.monitor=val/nope", "callbacks.model_checkpoint.monitor=train/bpd",
    "+trainer.gradient_clip_val=1", "trainer.precision=16", "trainer.accelerator=tpu", "trainer.devices=0",
    "model.attention.codebook.temperature=0", "+model.attention.codebook.temperature=0", "codebook.temperature=0",
    "model.block.heads=3", "model.attention.window_len=999", "data.seq_len=8", "torch_threads=0",
    "optimized_metric=val/nope", "+trainer.max_time=abc", "trainer.max_epochs=3",
]  # fmt: skip
EVAL = [
    "split=train", "split=", "protocol=x", "sequence_len=0", "seq_len=-1", "carry_state=maybe", "output=/no/such/dir/x.json",
    "output=/", "limit_batches=0", "limit_batches=nan", "eval_batch_size=0", "accelerator=tpu", "precision=8",
    "torch_threads=0", "+model_options.attention.no_such=1", "+model_options.d_model=abc", "+nope=1", "splitt=val",
    "carry_state=true protocol=segment", "ckpt_path=/no/such.ckpt", "ckpt_path=.", "data_root=/no/such/root",
]  # fmt: skip
SAMPLE = [
    "num_bytes=1e12", "num_bytes=1000000000000", "num_bytes=-1", "num_bytes=abc", "num_samples=0", "temperature=-1",
    "temperature=nan", "top_k=0", "top_p=0", "top_p=1.5", "seed=-1", "device=tpu", "device=cuda:99", "prompt=''",
    "output=/no/such/dir/x", "image_nrow=0", "image_scale=0", "+nope=1", "num_byte=8", "ckpt_path=/no/such.ckpt",
    "torch_threads=abc", "temperature=inf",
]  # fmt: skip


def _cases() -> list[tuple[str, str, str]]:
    """(command, one bad override or a few, class) for every generated bad input."""
    rng = random.Random(0)
    cases = []
    for key, kind in TRAIN_NUMBERS.items():  # a seeded sample of the non-numbers for each number
        values = rng.sample(NON_NUMBERS if kind is float else [*NON_NUMBERS, "1.5"], PER_NUMBER)
        cases += [("train", f"{key}={value}", "type or range") for value in values]
    for typo in TYPOS:
        cases += [("train", f"{typo}=1", "misspelt key"), ("train", f"+{typo}=1", "misspelt key")]
    cases += [("train", f"{group}=no_such_option", "unknown group option") for group in GROUPS]
    cases += [("train", override, "malformed override") for override in MALFORMED]
    cases += [("train", override, "run options and rules") for override in RUN_OPTIONS]
    for command, options in (("eval", schema.eval_options), ("sample", schema.sample_options)):
        for name, rule in constraints(options).items():
            cases += [(command, f"{name}={_shown(value)}", "range (schema)") for value in rule.bad_values()]
    cases += [("eval", override, "eval options") for override in EVAL]
    cases += [("sample", override, "sample options") for override in SAMPLE]
    return cases


def _shown(value: Any) -> str:
    return "nan" if isinstance(value, float) and math.isnan(value) else str(value)


CASES = _cases()


def _entry(command: str) -> Callable[..., Any]:
    if command == "train":
        spec = importlib.util.spec_from_file_location("train_entry", REPO / "train.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main
    from tvq_exp.run.evaluate import evaluate
    from tvq_exp.run.sample import sample

    return evaluate if command == "eval" else sample


def test_the_fuzz_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 250
    assert {command for command, _, _ in CASES} == {"train", "eval", "sample"}


@pytest.mark.parametrize(("command", "override", "kind"), CASES, ids=[f"{c}:{o}" for c, o, _ in CASES])
def test_a_bad_command_line_is_one_line_and_leaves_nothing(
    command: str,
    override: str,
    kind: str,
    good_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logs = tmp_path / "logs"
    base = TRAIN if command == "train" else [f"ckpt_path={good_run / 'checkpoints' / 'last.ckpt'}"]
    extra = ["limit_batches=1", "accelerator=cpu", "progress_bar=false"] if command == "eval" else []
    extra += ["num_bytes=4"] if command == "sample" and "num_bytes" not in override else []
    given = [*base, *extra, *override.split(" ")]
    monkeypatch.setattr(sys, "argv", [f"{command}.py", *given, f"paths.log_dir={logs}"])
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    with pytest.raises(SystemExit) as exit_info:
        run(command, _entry(command))
    err = capsys.readouterr().err
    assert exit_info.value.code not in (0, None), f"accepted: {override}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-3000:]
    for near in re.findall(r"did you mean ([\w.]+)\?", lines[0]):
        assert near not in re.split(r"[=\s]", override.lstrip("+~")), lines[0]
    left = [p for p in logs.rglob("*") if p.is_file()] if logs.exists() else []
    assert not left and not (logs / "runs").exists() or not any((logs / "runs").iterdir()), left
