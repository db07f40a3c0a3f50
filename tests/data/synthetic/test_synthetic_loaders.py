"""What every synthetic probe shares: batch format, seeding, exact resume, fixed evaluation sets, sharding."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tvq_exp.batch import IGNORE_INDEX, Batch
from tvq_exp.data.samplers import TrainLoader
from tvq_exp.data.synthetic import (
    InductionTask,
    MQARTask,
    PasskeyTask,
    SelectiveCopyTask,
    SyntheticDataModule,
)
from tvq_exp.data.synthetic.base import SyntheticTrainSampler

Factory = Callable[..., SyntheticDataModule]
LOADER = {"batch_size": 4, "eval_batch_size": 3, "steps_per_epoch": 3}


EVAL_SIZES = {"num_val_examples": 10, "num_test_examples": 7}


def probe(task: Callable[..., object], task_options: dict[str, object], **module_options: object) -> Factory:
    """A factory of the data module composed with ``task``; its keyword arguments are the module's options."""

    def factory(**options: object) -> SyntheticDataModule:
        return SyntheticDataModule(
            functools.partial(task, **task_options), **module_options | LOADER | options
        )

    return factory


mqar = probe(MQARTask, {"num_kv_pairs": 4}, seq_len=64, vocab_size=128, **EVAL_SIZES)
selective_copy = probe(SelectiveCopyTask, {"num_tokens_to_copy": 4}, seq_len=64, vocab_size=8, **EVAL_SIZES)
induction = probe(InductionTask, {}, seq_len=64, vocab_size=8, **EVAL_SIZES)
passkey = probe(PasskeyTask, {"lengths": [128, 192], "depths": [0.0, 0.5, 1.0], "eval_examples_per_cell": 2})


FACTORIES = {"mqar": mqar, "selective_copy": selective_copy, "induction": induction, "passkey": passkey}
# SHA-256 of the validation and test sets of each factory above with its defaults: a change to any generator,
# the seeding or the checksum itself changes these (update them only for a deliberate change).
EXPECTED_CHECKSUMS = {
    "mqar": {
        "validation": "27e2d6a290a6ddfcfffcac04b0e2c420b956488d8dd32c2daa5d493926d62fca",
        "test": "5b345dbb274f0381158967ebb6fc84dd0e2dd5856e847bda283891a333ecd700",
    },
    "selective_copy": {
        "validation": "221830558509180013b5f4a89caf9bf8f3d4c1dca9baa8dc08220a4050264325",
        "test": "35549b8dda7e079487a2248b26067fbc0b3bdf5501aa26bf3bc94a1ca99cb850",
    },
    "induction": {
        "validation": "75178236e8a5faaf3aae2b160325fffa65edba1c56280092a0427ef976c2fd8a",
        "test": "fc6553c85b3f7a2edd159abcfb3f39fb33d8e7583fc129c7db40bb912b602096",
    },
    "passkey": {  # also pins the Gutenberg books it reads (the validation and test books)
        "validation": "ea41a77b6ad537e6fede2ceb43143b55481fb85e028471b37cffed5c9e1bb88c",
        "test": "a725d84f5e34d32147d71e37f301c1b0a7ed108086f9c59cfe440e2986b5b6e6",
    },
}

factories = pytest.mark.parametrize("factory", FACTORIES.values(), ids=FACTORIES.keys())


def take(sampler: SyntheticTrainSampler, count: int) -> list[Batch]:
    iterator = iter(sampler)
    return [next(iterator) for _ in range(count)]


def same(a: list[Batch], b: list[Batch]) -> bool:
    return all(torch.equal(x[key], y[key]) for x, y in zip(a, b, strict=True) for key in x)


@factories
def test_batch_format(factory: Factory) -> None:
    module = factory()
    batch = next(iter(module.train_dataloader()))
    seq_len = module.seq_len
    assert set(batch) == {"input", "target", "bucket", "reset"}
    for key in ("input", "target", "bucket"):
        assert batch[key].shape == (4, seq_len) and batch[key].dtype == torch.int64
    assert batch["reset"].dtype == torch.bool and batch["reset"].all() and batch["reset"].shape == (4,)
    answer = batch["target"] != IGNORE_INDEX
    assert answer.any(1).all()
    assert (batch["bucket"][~answer] == -1).all()
    assert (batch["bucket"][answer] >= 0).all()
    assert (batch["bucket"][answer] < len(module.bucket_names("train"))).all()
    assert batch["input"].min() >= 0 and batch["input"].max() < module.vocab_size
    assert batch["target"][answer].max() < module.vocab_size
    assert module.kind == "synthetic" and module.context_len == seq_len


@factories
def test_seeded_batches(factory: Factory) -> None:
    first = take(factory(seed=5).train_sampler(rank=0), 2)
    assert same(first, take(factory(seed=5).train_sampler(rank=0), 2))
    assert not same(first, take(factory(seed=5).train_sampler(rank=1), 2))
    assert not same(first, take(factory(seed=6).train_sampler(rank=0), 2))
    assert not torch.equal(first[0]["input"], first[1]["input"])


@factories
def test_exact_resume_mid_epoch_and_across_epochs(factory: Factory) -> None:
    loader = TrainLoader(factory().train_sampler())
    consumed = [batch for _, batch in zip(range(2), loader, strict=False)]  # epoch 0, steps 0-1
    state = loader.state_dict()
    assert state == {"epoch": 0, "step": 2}
    reference = list(loader) + list(loader)  # rest of epoch 0, then epoch 1
    assert len(reference) == 1 + 3

    resumed = TrainLoader(factory().train_sampler())
    resumed.load_state_dict(state)
    again = list(resumed) + list(resumed)
    assert same(reference, again)
    assert not same(consumed, reference[:2])


@factories
def test_evaluation_sets_are_fixed_and_distinct(factory: Factory) -> None:
    module = factory()
    checksums = module.eval_checksums
    assert checksums == factory(seed=123, batch_size=2).eval_checksums  # independent of training options
    assert checksums["validation"] != checksums["test"]
    assert factory(val_seed=9).eval_checksums["validation"] != checksums["validation"]
    assert factory(val_seed=9).eval_checksums["test"] == checksums["test"]
    train = next(iter(module.train_dataloader()))["input"].numpy()
    assert not any((module.eval_examples("validation").input == row).all(1).any() for row in train)


@pytest.mark.parametrize("name", FACTORIES)
def test_evaluation_checksums_are_pinned(name: str) -> None:
    assert FACTORIES[name]().eval_checksums == EXPECTED_CHECKSUMS[name]


@factories
@pytest.mark.parametrize("world_size", [1, 3])
def test_evaluation_shards_cover_every_example_once(factory: Factory, world_size: int) -> None:
    module = factory()
    examples = module.eval_examples("test")
    shards = [list(module.eval_loader("test", rank, world_size)) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1
    rows = [
        (batch["input"][i], batch["target"][i])
        for shard in shards
        for batch in shard
        for i in range(len(batch["input"]))
        if (batch["target"][i] != IGNORE_INDEX).any()
    ]
    assert len(rows) == len(examples)
    seen = sorted(bytes(np.concatenate([x.numpy(), y.numpy()])) for x, y in rows)
    expected = sorted(
        bytes(np.concatenate([x, y])) for x, y in zip(examples.input, examples.target, strict=True)
    )
    assert seen == expected
    assert all(len(batch["input"]) <= 3 for shard in shards for batch in shard)
