"""DDP and FSDP on CPU (2 gloo processes, ``trainer=ddp_cpu`` / ``trainer=fsdp_cpu``) through ``train.py``: one
run directory, the stated global batch, identical codebooks on both ranks, and a logged validation metric
(reduced over ranks) equal to a single-process evaluation of the same weights on the same split; under FSDP
the weights are sharded (each rank's checkpoint file holds its half) and the sharded checkpoint converts to
one file that ``eval.py`` reads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.distributed.checkpoint import FileSystemReader

from tests.helpers.sweeps import REPO, run_train
from tvq_exp.callbacks.codebook_sync import SYNC_FILE
from tvq_exp.callbacks.global_batch import GlobalBatchSize, global_batch_size
from tvq_exp.run.checkpoints import gather_checkpoint, is_sharded
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.fsdp import consolidate

STEPS = 3
DDP_OVERRIDES = [
    "experiment=smoke",
    "trainer=ddp_cpu",
    "data=shakespeare",  # small validation split: the whole split is evaluated
    "data.seq_len=128",
    "data.batch_size=4",
    "data.eval_batch_size=128",
    f"trainer.max_steps={STEPS}",
    f"trainer.val_check_interval={STEPS}",
    "trainer.limit_val_batches=null",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "++callbacks.sync._target_=tvq_exp.callbacks.codebook_sync.CodebookSync",
    "++callbacks.sync.output_dir=${paths.output_dir}",
    "++callbacks.global_batch._target_=tvq_exp.callbacks.global_batch.GlobalBatchSize",
    "++callbacks.global_batch.per_device=${data.batch_size}",
    "++callbacks.global_batch.expected=8",
]


def _single_process_val_bpb(ckpt: Path, out: Path) -> float:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "eval", overrides=[f"ckpt_path={ckpt}", "accelerator=cpu", "progress_bar=false", f"output={out}"]
        )
    return evaluate(cfg)["bpb"]


def test_ddp_cpu_one_run_dir_synced_codebooks_reduced_validation(tmp_path: Path, data_dir: Path) -> None:
    proc = run_train([*DDP_OVERRIDES, f"paths.log_dir={tmp_path / 'logs'}"], cwd=tmp_path, timeout=300)
    assert "global batch 8 sequences = 4 per device x 2 processes x 1 accumulation" in proc.stdout
    runs = list((tmp_path / "logs" / "runs").iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    sync = json.loads((run / SYNC_FILE).read_text())
    assert sync["world_size"] == 2 and len(sync["hashes"]) == 2 and sync["identical"]
    assert sync["global_step"] == STEPS

    accumulator = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    logged = accumulator.Scalars("val/bpb")[-1]
    single = _single_process_val_bpb(run / "checkpoints" / "last.ckpt", tmp_path / "eval.json")
    assert math.isclose(logged.value, single, rel_tol=1e-4), (logged.value, single)
    # codebook health: code counts summed over the ranks equal one process's over the whole split
    health = json.loads((tmp_path / "eval.json").read_text())["codebook"]
    assert list(health) == ["layer0", "layer1"]
    for layer, result in health.items():
        for metric in ("perplexity", "dead_fraction"):
            value = accumulator.Scalars(f"codebook/{layer}/val_{metric}")[-1].value
            assert math.isclose(value, result[metric], rel_tol=1e-5), (layer, metric, value, result[metric])


def test_fsdp_cpu_shards_weights_syncs_codebooks_and_converts_for_eval(
    tmp_path: Path, data_dir: Path
) -> None:
    overrides = [o.replace("trainer=ddp_cpu", "trainer=fsdp_cpu") for o in DDP_OVERRIDES]
    overrides += ["trainer.strategy.save_distributed_checkpoint=true", f"paths.log_dir={tmp_path / 'logs'}"]
    proc = run_train(overrides, cwd=tmp_path, timeout=300)
    assert "global batch 8 sequences = 4 per device x 2 processes x 1 accumulation" in proc.stdout
    (run,) = list((tmp_path / "logs" / "runs").iterdir())
    sync = json.loads((run / SYNC_FILE).read_text())
    assert sync["world_size"] == 2 and sync["identical"] and sync["global_step"] == STEPS

    sharded = run / "checkpoints" / "last.ckpt"
    assert sharded.is_dir() and sorted(p.name for p in sharded.glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    metadata = FileSystemReader(str(sharded)).read_metadata().state_dict_metadata
    weight = next(k for k in metadata if k.startswith("state_dict.model.blocks.0.") and k.endswith("weight"))
    chunks = metadata[weight].chunks  # one chunk per rank: each holds half of the rows
    assert len(chunks) == 2 and sum(c.sizes[0] for c in chunks) == metadata[weight].size[0]

    single = consolidate(sharded, tmp_path / "single.ckpt")
    logged = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    logged.Reload()
    value = logged.Scalars("val/bpb")[-1].value
    assert math.isclose(value, _single_process_val_bpb(single, tmp_path / "eval.json"), rel_tol=1e-4)


def _loss_curve(run: Path) -> list[tuple[int, float]]:
    values = []
    for events in sorted((run / "tensorboard").glob("events.out.tfevents.*")):
        logged = EventAccumulator(str(events), size_guidance={"scalars": 0})
        logged.Reload()
        values += [(e.step, e.value) for e in logged.Scalars("train/loss")]
    return sorted(values)


def test_fsdp_sharded_checkpoint_resumes_to_the_uninterrupted_run(tmp_path: Path, data_dir: Path) -> None:
    """``resume=auto`` finds a sharded ``last.ckpt/`` folder and continues exactly: 2 + 2 steps give the
    weights, optimiser and loss curve of 4 straight steps (the schedule is set for 4 in both)."""
    fixed = ("trainer.max_steps=", "trainer.val_check_interval=", "trainer=")
    overrides = [o for o in DDP_OVERRIDES if not o.startswith(fixed)] + [
        "trainer=fsdp_cpu",
        "trainer.strategy.save_distributed_checkpoint=true",
        "trainer.val_check_interval=2",
        "module.max_steps=4",
        "resume=auto",
        f"paths.log_dir={tmp_path / 'logs'}",
    ]
    run_train([*overrides, "run_name=straight", "trainer.max_steps=4"], cwd=tmp_path, timeout=300)
    run_train([*overrides, "run_name=pieces", "trainer.max_steps=2"], cwd=tmp_path, timeout=300)
    second = run_train([*overrides, "run_name=pieces", "trainer.max_steps=4"], cwd=tmp_path, timeout=300)
    straight, pieces = (tmp_path / "logs" / "runs" / name for name in ("straight", "pieces"))
    assert f"resuming from {pieces / 'checkpoints' / 'last.ckpt'}" in second.stdout
    last, previous = pieces / "checkpoints" / "last.ckpt", pieces / "checkpoints" / "last.prev.ckpt"
    assert is_sharded(last) and is_sharded(
        previous
    )  # the replaced checkpoint is kept; no staging folder left
    assert not [p.name for p in (pieces / "checkpoints").iterdir() if p.name.startswith(".")]
    a, b = gather_checkpoint(straight / "checkpoints" / "last.ckpt"), gather_checkpoint(last)
    assert a["global_step"] == b["global_step"] == 4
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    moments = [(s["exp_avg"], s["exp_avg_sq"]) for s in a["optimizer_states"][0]["state"].values()]
    resumed = [(s["exp_avg"], s["exp_avg_sq"]) for s in b["optimizer_states"][0]["state"].values()]
    assert all(
        torch.equal(x, y)
        for pair, other in zip(moments, resumed, strict=True)
        for x, y in zip(pair, other, strict=True)
    )
    curve = _loss_curve(pieces)
    assert [step for step, _ in curve] == [
        step for step, _ in _loss_curve(straight)
    ] and curve == _loss_curve(straight)


def test_global_batch_size_is_per_device_times_processes_times_accumulation() -> None:
    assert global_batch_size(4, 2, 1) == 8
    assert global_batch_size(2, 8, 4) == 64


def test_global_batch_mismatch_is_a_clear_error() -> None:
    trainer = SimpleNamespace(world_size=2, accumulate_grad_batches=2)
    with pytest.raises(ValueError, match="global_batch_size=8"):
        GlobalBatchSize(per_device=4, expected=8).setup(trainer, None, "fit")  # type: ignore[arg-type]
