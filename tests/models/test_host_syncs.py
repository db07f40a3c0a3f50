"""No host-device synchronisation inside a training step, outside the logging steps: a real training run on CPU
(the whole Lightning step: forward, loss, metrics, backward, clipping, the finiteness verdict, the optimiser, the
codebook update, the default callbacks), every host read counted per step by
:class:`tests.helpers.syncs.SyncsPerStep`. On a GPU each read would make the step wait for the device.

The window is from ``on_train_batch_start`` to the callbacks' ``on_train_batch_end``: what follows it
(the module's own ``on_train_batch_end``, Lightning's logger update) reads only at the logging steps. A
k-means-initialised codebook reads the host once, at its first step (the init itself).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.config import train_run
from tests.helpers.syncs import read_rows

EVERY = 3
TINY = {
    "gau_vq": ["model.d_model=32", "++model.block.d_k=16"],
    "mha_vq": ["model.d_model=32", "model.block.heads=2"],
}


def syncs_per_step(model: str, codebook: str, tmp_path: Path) -> list[dict]:
    rows = tmp_path / "syncs.jsonl"
    train_run(
        [
            "experiment=smoke", f"model={model}", *TINY[model], f"codebook={codebook}", "model.n_layers=2",
            "model.attention.codebook_size=16", "model.attention.block_len=16", "data.seq_len=48",
            "data.batch_size=2", "trainer.max_steps=7", f"trainer.log_every_n_steps={EVERY}",
            "trainer.val_check_interval=100", "torch_threads=1", "logger=csv", "+module.weight_decay_mode=official",
            "+callbacks.syncs._target_=tests.helpers.syncs.SyncsPerStep", f"+callbacks.syncs.path={rows}",
        ],
        tmp_path / "run",
    )  # fmt: skip
    return read_rows(rows)


@pytest.mark.parametrize(
    ("model", "codebook", "first"),
    [("gau_vq", "ema", 1), ("gau_vq", "healthy", 2), ("mha_vq", "sampled", 2)],
)
def test_no_step_reads_the_device_outside_the_logging_steps(
    model: str, codebook: str, first: int, tmp_path: Path
) -> None:
    rows = syncs_per_step(model, codebook, tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 8))
    quiet = {r["step"]: r["events"] for r in rows if r["step"] % EVERY and r["step"] >= first}
    assert quiet and all(events == [] for events in quiet.values()), quiet
    logging = [r for r in rows if r["step"] % EVERY == 0]
    assert all(len(r["events"]) <= 2 for r in logging), logging  # the progress bar's loss, nothing per layer
