"""Training with TBPTT end to end: the state is carried across a sequence's updates and reset at the next,
a run preempted in the middle of a sequence resumes exactly, and validation reports bits by position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.helpers.data import shipped_text
from tests.helpers.paths import CONF
from tests.helpers.reliability import read_records
from tvq_exp.run.checkpoints import read_checkpoint
from tvq_exp.run.train import train

BASE = [
    "experiment=smoke",
    "data=shakespeare",
    "data.seq_len=32",
    "data.sampler=tbptt",
    "data.sequence_len=128",  # 4 updates per sequence
    "data.batch_size=2",
    "data.eval_batch_size=2",
    "data.eval_protocol=sequence",
    "model.attention.block_len=16",
    "model.attention.codebook_size=16",
    "module.position_bucket_len=16",
    "trainer.max_steps=12",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=8",
    "trainer.enable_progress_bar=false",
    "logger=none",
]


def run(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """Train on text the repository ships (no data root needed: these tests always run)."""
    corpus = shipped_text(run_dir.parent)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[*BASE, f"data.corpus.path={corpus}", *overrides, f"paths.output_dir={run_dir}"],
        )
    return train(cfg)


def helper(name: str, target: str, **kwargs: Any) -> list[str]:
    return [f"+callbacks.{name}._target_=tests.helpers.reliability.{target}"] + [
        f"+callbacks.{name}.{key}={value}" for key, value in kwargs.items()
    ]


def test_a_run_preempted_mid_sequence_resumes_exactly(tmp_path: Path) -> None:
    straight, pieces = tmp_path / "straight.jsonl", tmp_path / "pieces.jsonl"
    run(helper("rec", "Recorder", path=straight), tmp_path / "a")
    auto = ["resume=auto", "run_name=b"]
    first = run(
        [*auto, *helper("rec", "Recorder", path=pieces), *helper("kill", "SignalAt", step=6)], tmp_path / "b"
    )
    assert first["global_step"] == 6  # in the middle of the second sequence: its state is carried over
    assert read_checkpoint(tmp_path / "b" / "checkpoints" / "last.ckpt")["train_state"] is not None
    second = run([*auto, *helper("rec", "Recorder", path=pieces)], tmp_path / "b")
    assert second["global_step"] == 12
    expected, got = read_records(straight), read_records(pieces)
    assert [r["step"] for r in got] == list(range(1, 13))
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # bit for bit, every update
    assert [r["checksum"] for r in got] == [r["checksum"] for r in expected]
    a = read_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt")["state_dict"]
    b = read_checkpoint(tmp_path / "b" / "checkpoints" / "last.ckpt")["state_dict"]
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_the_state_is_carried_within_a_sequence_and_reset_at_the_next(tmp_path: Path) -> None:
    """The carried state after update u of a sequence has seen (u + 1)·32 positions; a new sequence
    starts from nothing (the VQ state's position ``t`` restarts)."""
    seen = tmp_path / "state.jsonl"
    result = run([*helper("pos", "StatePosition", path=seen), "trainer.max_steps=8"], tmp_path / "run")
    rows = read_records(seen)
    assert [r["t"] for r in rows] == [32, 64, 96, 128, 32, 64, 96, 128]
    assert result["val"]["position_buckets"][0]["start"] == 0
    buckets = result["val"]["position_buckets"]
    assert [b["end"] for b in buckets] == [16, 32, 64, 128]  # log-spaced up to the sequence length
    mean = sum(b["bpb"] * b["tokens"] for b in buckets) / sum(b["tokens"] for b in buckets)
    assert mean == pytest.approx(result["val"]["bpb"], rel=1e-6)  # the buckets add up to the total


def test_a_carried_state_on_the_device_is_taken_as_it_is_and_one_elsewhere_is_moved() -> None:
    """The step continues the last step's state without copying it (its tensors are where the batch is); a state
    restored elsewhere (a checkpoint's, on the host) is moved tensor by tensor, nested states too."""
    from tvq_exp.attention import build_attention
    from tvq_exp.models.module import state_on

    layer = build_attention("vq", d_k=8, d_v=8, heads=2, codebook_size=4, block_len=4)
    _, state, _ = layer(*(torch.randn(1, 2, 8, 8) for _ in range(3)))
    assert state.tensors()
    blocks = [state, state]
    assert state_on(blocks, torch.device("cpu")) is blocks
    moved = state_on(blocks, torch.device("meta"))
    assert len(moved) == 2 and all(s.position == state.position for s in moved)
    assert [t.device.type for s in moved for t in s.tensors()] == ["meta"] * 2 * len(state.tensors())
    assert [t.shape for t in moved[0].tensors()] == [t.shape for t in state.tensors()]
