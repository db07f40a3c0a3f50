"""DDP on CPU (2 gloo processes, ``trainer=ddp_cpu``) through ``train.py``: one run directory, the stated
global batch, identical codebooks on both ranks, and a logged validation metric (reduced over ranks)
equal to a single-process evaluation of the same weights on the same split."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.sweeps import REPO, run_train
from tvq_exp.callbacks.codebook_sync import SYNC_FILE
from tvq_exp.callbacks.global_batch import GlobalBatchSize, global_batch_size
from tvq_exp.run.evaluate import evaluate

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


def test_global_batch_size_is_per_device_times_processes_times_accumulation() -> None:
    assert global_batch_size(4, 2, 1) == 8
    assert global_batch_size(2, 8, 4) == 64


def test_global_batch_mismatch_is_a_clear_error() -> None:
    trainer = SimpleNamespace(world_size=2, accumulate_grad_batches=2)
    with pytest.raises(ValueError, match="global_batch_size=8"):
        GlobalBatchSize(per_device=4, expected=8).setup(trainer, None, "fit")  # type: ignore[arg-type]
