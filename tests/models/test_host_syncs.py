"""No host-device synchronisation inside a training step, outside the logging steps: a real training run on CPU
(the whole Lightning step: forward, loss, metrics, backward, clipping, the finiteness verdict, the optimiser, the
codebook update, the default callbacks), every host read counted per step by
:class:`tests.helpers.syncs.SyncsPerStep`. On a GPU each read would make the step wait for the device.

The window is from ``on_train_batch_start`` to the callbacks' ``on_train_batch_end``: what follows it
(the module's own ``on_train_batch_end``, Lightning's logger update) reads only at the logging steps. A
k-means-initialised codebook reads the host once, at its first step (the init itself).

The count itself is tested op by op: each op whose CUDA kernel reads the device inside it (a result sized by its
values, a boolean mask, a host check) is counted once, and its neighbours that read nothing are not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.config import train_run
from tests.helpers.syncs import read_rows
from tvq_exp.measure.syncs import counting_syncs

EVERY = 3
TINY = {
    "gau_vq": ["model.d_model=32", "++model.block.d_k=16"],
    "mha_vq": ["model.d_model=32", "model.block.heads=2"],
}


PAPER = [
    "experiment=enwik8_paper", "trainer=cpu", "trainer.devices=1", "global_batch_size=null", "data=kjv",
    "data.batch_size=2", "data.seq_len=32", "data.sequence_len=96", "block_len=16", "codebook_size=16",
    "model.d_model=32", "model.block.d_k=16", "model.n_layers=2", "trainer.limit_val_batches=1",
    "trainer.check_val_every_n_epoch=null",
]  # fmt: skip


def syncs_per_step(overrides: list[str], tmp_path: Path, steps: int = 7) -> list[dict]:
    rows = tmp_path / "syncs.jsonl"
    train_run(
        [
            *overrides, f"trainer.max_steps={steps}", f"trainer.log_every_n_steps={EVERY}",
            "trainer.val_check_interval=100", "torch_threads=1", "logger=csv",
            "+callbacks.syncs._target_=tests.helpers.syncs.SyncsPerStep", f"+callbacks.syncs.path={rows}",
        ],
        tmp_path / "run",
    )  # fmt: skip
    return read_rows(rows)


def small(model: str, codebook: str, layers: int = 2, seq_len: int = 48) -> list[str]:
    return [
        "experiment=smoke", f"model={model}", *TINY[model], f"codebook={codebook}", f"model.n_layers={layers}",
        "model.attention.codebook_size=16", "model.attention.block_len=16", f"data.seq_len={seq_len}",
        "data.batch_size=2", "+module.weight_decay_mode=official",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("run", "first"),
    [
        (small("gau_vq", "ema"), 1),
        (small("gau_vq", "healthy"), 2),
        (small("mha_vq", "sampled"), 2),
        (PAPER, 1),  # LayerDrop, dropout, TBPTT's carried state, the gradient through the cache
    ],
    ids=["gau_vq-ema", "gau_vq-healthy", "mha_vq-sampled", "enwik8_paper"],
)
def test_no_step_reads_the_device_outside_the_logging_steps(
    run: list[str], first: int, tmp_path: Path
) -> None:
    rows = syncs_per_step(run, tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 8))
    quiet = {r["step"]: r["events"] for r in rows if r["step"] % EVERY and r["step"] >= first}
    assert quiet and all(events == [] for events in quiet.values()), quiet
    logging = [r for r in rows if r["step"] % EVERY == 0]
    # the progress bar's loss, the codebook metrics' means, the throughput's wait: nothing per layer
    assert all(len(r["events"]) <= 3 for r in logging), logging


def test_the_fused_kernels_step_reads_the_device_only_at_the_logging_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kernel=triton`` under Triton's interpreter: the fused op's own code (layout, grids, the cache's means, the
    fused code search) reads nothing, as on a GPU (the interpreter's copies of the operands are storage copies, not
    counted). One layer, four steps: the interpreter is slow."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run = [*small("gau_vq", "ema", layers=1, seq_len=32), "model.attention.kernel=triton"]
    rows = syncs_per_step(run, tmp_path, steps=4)
    reads = {r["step"]: r["events"] for r in rows if r["step"] % EVERY}
    assert reads == {1: [], 2: [], 4: []}, rows


X = torch.arange(-3.0, 5.0)
MASK = X > 0
REPEATS = torch.tensor([1, 2, 0, 1, 1, 1, 1, 1])
# each op whose CUDA kernel reads the device, though on a CPU no scalar read is dispatched: what the count names
READS_INSIDE = {
    "x[mask]": (lambda: X[MASK], "boolean mask indexing"),
    "x[mask] = tensor": (lambda: X.clone().__setitem__(MASK, X[4:] * 2), "boolean mask indexing"),
    "index_put_ accumulating": (
        lambda: X.clone().index_put_((MASK,), torch.tensor(1.0), accumulate=True),
        "boolean mask indexing",
    ),
    "torch.where(mask)": (lambda: torch.where(MASK), "nonzero"),
    "nonzero": (lambda: MASK.nonzero(), "nonzero"),
    "masked_select": (lambda: X.masked_select(MASK), "masked_select"),
    "unique": (lambda: torch.unique(REPEATS), "unique"),
    "unique_consecutive": (lambda: torch.unique_consecutive(REPEATS), "unique"),
    "bincount": (lambda: torch.bincount(REPEATS, minlength=16), "bincount"),
    "repeat_interleave": (lambda: X.repeat_interleave(REPEATS), "repeat_interleave without output_size"),
    "equal": (lambda: torch.equal(X, X), "equal"),
    "allclose": (lambda: torch.allclose(X, X), "allclose"),
    "histc": (lambda: torch.histc(X), "histc without a range"),
    "multinomial, one draw": (
        lambda: torch.multinomial(X.abs(), 1),
        "multinomial's check of its probabilities",
    ),
    "multinomial, no replacement": (
        lambda: torch.multinomial(X.abs(), 3),
        "multinomial's check of its probabilities",
    ),
}
# their neighbours that read nothing on a GPU
READS_NOTHING = {
    "x[mask] = 0.": lambda: X.clone().__setitem__(MASK, 0.0),  # ATen runs it as masked_fill_
    "x[index]": lambda: X[torch.tensor([0, 2])],
    "torch.where(mask, x, 0.)": lambda: torch.where(MASK, X, 0.0),
    "repeat_interleave by an int": lambda: X.repeat_interleave(2),
    "histc with a range": lambda: torch.histc(X, bins=4, min=-4, max=5),
    "multinomial with replacement": lambda: torch.multinomial(X.abs(), 3, replacement=True),
    "masked_fill": lambda: X.masked_fill(MASK, 0.0),
}


@pytest.mark.parametrize("name", list(READS_INSIDE))
def test_an_op_that_reads_the_device_inside_its_kernel_is_counted_once(name: str) -> None:
    call, kind = READS_INSIDE[name]
    with counting_syncs() as syncs:
        call()
    assert [k for k, _ in syncs.events] == [kind]
    assert all(place.startswith(__file__) for _, place in syncs.events), syncs.events


@pytest.mark.parametrize("name", list(READS_NOTHING))
def test_its_neighbours_that_read_nothing_are_not_counted(name: str) -> None:
    with counting_syncs() as syncs:
        READS_NOTHING[name]()
    assert syncs.events == []


_BODY: dict[str, object] = {}  # the case the test op's body runs


@torch.library.custom_op("tvq_test::runs_a_case", mutates_args=())
def runs_a_case(x: torch.Tensor) -> torch.Tensor:
    """A custom op, as the fused kernels' wrappers are, whose Python body runs ``_BODY["call"]``."""
    _BODY["call"]()
    return x.clone()


@pytest.mark.parametrize("name", ["x[mask]", "torch.where(mask)", "bincount", "repeat_interleave", "equal"])
def test_a_read_inside_a_custom_ops_body_is_counted_once(name: str) -> None:
    _BODY["call"], kind = READS_INSIDE[name]
    with counting_syncs() as syncs:
        runs_a_case(torch.ones(2))
    assert [k for k, _ in syncs.events] == [kind]


@pytest.mark.parametrize("read", ["item", "int", "tolist", "cpu"])
def test_a_scalar_read_inside_a_custom_ops_body_is_counted_once(read: str) -> None:
    _BODY["call"] = {
        "item": lambda: X.sum().item(),
        "int": lambda: int(X.max()),
        "tolist": lambda: X.tolist(),
        "cpu": lambda: X.cpu(),
    }[read]
    with counting_syncs() as syncs:
        runs_a_case(torch.ones(2))
    assert [k for k, _ in syncs.events] == ["item" if read == "int" else read]


def test_a_custom_ops_body_that_reads_nothing_is_not_counted() -> None:
    _BODY["call"] = READS_NOTHING["x[mask] = 0."]
    with counting_syncs() as syncs:
        runs_a_case(torch.ones(2))
    assert syncs.events == []


def test_an_explicit_wait_for_the_device_is_counted_where_it_is_asked_for() -> None:
    """``tvq_exp.measure.timing.sync`` waits for nothing on a CPU; on a GPU the same line waits for everything."""
    from tvq_exp.measure.timing import sync

    with counting_syncs() as syncs:
        sync(torch.device("cpu"))
    assert [k for k, _ in syncs.events] == ["synchronize"]
    assert syncs.events[0][1].startswith(__file__), syncs.events
    sync(torch.device("cpu"))  # no count running: nothing to record
