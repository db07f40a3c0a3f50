"""Every checkpoint records a fingerprint of its data; resuming or evaluating on a corpus that grew or was edited
is refused in one line, ``allow_data_change=true`` goes on (docs/reliability.md, "Data integrity")."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tests.helpers.paths import CONF
from tvq_exp.callbacks.data_fingerprint import split_fingerprint
from tvq_exp.run.errors import USAGE_STATUS, reported
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.train import train

QUIET = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "logger=none",
]


def _compose(name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def _refused(capsys: pytest.CaptureFixture[str], task: object, cfg: DictConfig) -> str:
    with pytest.raises(SystemExit) as exit_info:
        reported(task)(cfg)  # type: ignore[arg-type]
    assert exit_info.value.code == USAGE_STATUS
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_fingerprint_sees_length_ends_and_sampled_blocks() -> None:
    data = np.frombuffer(b"abcdefgh" * 500_000, dtype=np.uint8)  # 4 MB: ends and 256 blocks sampled
    base = split_fingerprint(data)
    assert base[0] == 4_000_000 and split_fingerprint(data.copy()) == base
    for position in (0, len(data) - 1, int(np.linspace(0, len(data) - 4096, 256)[100]) + 7):
        edited = data.copy()
        edited[position] ^= 1
        assert split_fingerprint(edited) != base, position
    assert split_fingerprint(data[:-1]) != base


def test_resume_and_eval_refuse_a_changed_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"It was the best of times, it was the worst of times. " * 2000)
    base = ["experiment=smoke", "data=text_files", f"data.corpus.path={corpus}", "data.corpus.split_by=bytes",
            "data.seq_len=64", *QUIET]  # fmt: skip
    run = tmp_path / "run"
    train(
        _compose(
            "train", [*base, "trainer.max_steps=2", "trainer.val_check_interval=2", f"paths.output_dir={run}"]
        )
    )
    last = run / "checkpoints" / "last.ckpt"
    eval_cfg = ["accelerator=cpu", "progress_bar=false", "limit_batches=1", f"output={tmp_path / 'e.json'}"]
    evaluate(_compose("eval", [f"ckpt_path={last}", *eval_cfg]))  # the same data: fine

    corpus.write_bytes(corpus.read_bytes() + b"A new chapter. " * 300)  # the corpus grew
    resume = [*base, "trainer.max_steps=4", f"ckpt_path={last}", f"paths.output_dir={run}"]
    # the keys laid over the stored run (experiment=, a group all over the config, cannot be)
    given = resume[1:]
    resumed = functools.partial(train, overrides=given)  # in-process: the overrides laid over the stored run
    line = _refused(capsys, resumed, _compose("train", resume))
    assert line.startswith("error: the data differ from those the checkpoint was trained on (train ")
    assert "allow_data_change=true" in line
    line = _refused(capsys, evaluate, _compose("eval", [f"ckpt_path={last}", *eval_cfg]))
    assert "the data differ" in line and "validation" in line
    allowed = [*resume, "allow_data_change=true"]
    assert train(_compose("train", allowed), overrides=allowed[1:])["global_step"] == 4
    assert (
        evaluate(_compose("eval", [f"ckpt_path={last}", *eval_cfg, "allow_data_change=true"]))["tokens"] > 0
    )
