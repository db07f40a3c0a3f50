"""What every synthetic probe shares: the example arrays, gap buckets and cells, the seeded samplers, the gap
task base (:class:`GapTask`), the data module.

Over 300 lines: the one data module every probe's task is composed with, and the seeding contract (below) that
its samplers, evaluation sets and checksums implement together; split, each part would restate it.

A probe writes :class:`Examples`: ``input``, ``target`` and ``bucket``, each ``(N, T)`` int64. ``target`` is
:data:`~tvq_exp.batch.IGNORE_INDEX` wherever no loss is taken, and ``bucket`` is the bucket id at every
answer position (``target != IGNORE_INDEX``) and ``-1`` elsewhere. Batches add ``reset`` ``(B,)`` bool, always
True: every row is one independent sequence.

Seeding: training batch ``j`` (counted over epochs, ``j = epoch * steps_per_epoch + step``) of rank ``r``
comes from ``numpy.random.default_rng([seed, r, j])``, so a run resumes exactly from its step counter and
ranks differ. The validation and test sets are generated once from
``default_rng([val_seed, EVAL_STREAM, 1])`` and ``default_rng([test_seed, EVAL_STREAM, 2])`` (a separate
stream from any training batch) and do not depend on the world size.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
import torch

from tvq_exp.batch import IGNORE_INDEX, Batch
from tvq_exp.data.module import RootedDataModule
from tvq_exp.data.samplers import EpochSampler, TrainLoader
from tvq_exp.options import AtLeast, OneOf, PositiveInt, checked

EVAL_SPLITS = ("validation", "test")
EVAL_STREAM = 0x5EED_E7A1  # second seed word of the evaluation sets: keeps them apart from training batches
SPLIT_STREAMS = {"validation": 1, "test": 2}
NO_BUCKET = -1
DEFAULT_FIRST_GAP = 32


# ----------------------------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Examples:
    """``N`` synthetic sequences: ``input``, ``target``, ``bucket``, each ``(N, T)`` int64."""

    input: np.ndarray
    target: np.ndarray
    bucket: np.ndarray

    def __len__(self) -> int:
        return len(self.input)

    @classmethod
    def empty(cls, num_examples: int, seq_len: int) -> Examples:
        """All-padding rows: input 0, target :data:`IGNORE_INDEX`, bucket ``-1``, ``(N, T)`` each."""
        shape = (num_examples, seq_len)
        return cls(
            np.zeros(shape, dtype=np.int64),
            np.full(shape, IGNORE_INDEX, dtype=np.int64),
            np.full(shape, NO_BUCKET, dtype=np.int64),
        )

    def rows(self, index: np.ndarray | slice) -> Examples:
        """The rows ``index`` (an index array or a slice)."""
        return Examples(self.input[index], self.target[index], self.bucket[index])

    def concat(self, other: Examples) -> Examples:
        """These rows followed by ``other``'s."""
        return Examples(
            np.concatenate([self.input, other.input]),
            np.concatenate([self.target, other.target]),
            np.concatenate([self.bucket, other.bucket]),
        )

    def to_batch(self) -> Batch:
        """The batch: ``input``/``target``/``bucket`` ``(B, T)`` int64, ``reset`` ``(B,)`` all True."""
        return {
            "input": torch.from_numpy(np.ascontiguousarray(self.input, dtype=np.int64)),
            "target": torch.from_numpy(np.ascontiguousarray(self.target, dtype=np.int64)),
            "bucket": torch.from_numpy(np.ascontiguousarray(self.bucket, dtype=np.int64)),
            "reset": torch.ones(len(self), dtype=torch.bool),
        }

    def checksum(self) -> str:
        """SHA-256 hex digest of ``input``, ``target``, ``bucket`` (in that order) as little-endian int64."""
        digest = hashlib.sha256()
        for array in (self.input, self.target, self.bucket):
            digest.update(np.ascontiguousarray(array, dtype="<i8").tobytes())
        return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- buckets


def gap_edges(seq_len: int, first: int = DEFAULT_FIRST_GAP) -> np.ndarray:
    """Log-spaced bucket edges ``[0, first, 2*first, 4*first, ...]``, the last one ``>= seq_len``."""
    edges = [0, first]
    while edges[-1] < seq_len:
        edges.append(2 * edges[-1])
    return np.asarray(edges, dtype=np.int64)


def gap_bucket(distance: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket id of each distance (``edges[i] <= d < edges[i + 1]`` -> ``i``), same shape as ``distance``."""
    return np.searchsorted(edges, distance, side="right").astype(np.int64) - 1


def gap_bucket_names(edges: np.ndarray) -> list[str]:
    """``"gap_<lo>_<hi>"`` for each bucket ``[lo, hi)``."""
    return [f"gap_{lo}_{hi}" for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)]


def draw_cells(rng: np.random.Generator, num_examples: int, num_cells: int, split: str) -> np.ndarray:
    """The bucket cell of each example, ``(N,)``: uniform for training rows; ``i % num_cells`` for evaluation row
    ``i``, so an evaluation set holds every cell equally often."""
    if split == "train":
        return rng.integers(num_cells, size=num_examples)
    return np.arange(num_examples) % num_cells


# ----------------------------------------------------------------------------------------------- samplers

ExampleFn = Callable[[np.random.Generator, int], Examples]


class SyntheticTrainSampler(EpochSampler):
    """Training batches generated on the fly: batch ``j`` of rank ``r`` from ``default_rng([seed, r, j])``.

    ``j = epoch * steps_per_epoch + step`` counts batches over epochs, so :meth:`state_dict` (epoch and step)
    is all a resume needs. Each batch is ``generate(rng, batch_size)`` as a batch dict (:class:`Examples`).
    """

    def __init__(
        self, generate: ExampleFn, batch_size: int, steps_per_epoch: int, seed: int, rank: int
    ) -> None:
        super().__init__(batch_size, seed, rank, world_size=1)  # ranks differ by seed, not by share
        self.generate, self.steps_per_epoch = generate, steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def batch(self, index: int) -> Batch:
        """Batch number ``index`` (counted over epochs) of this rank."""
        rng = np.random.default_rng([self.seed, self.rank, index])
        return self.generate(rng, self.batch_size).to_batch()

    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        for step in range(start, self.steps_per_epoch):
            yield self.batch(epoch * self.steps_per_epoch + step)


class SyntheticEvalLoader:
    """A fixed evaluation set in batches of ``batch_size`` rows, sharded over ranks.

    Rank ``r`` of ``W`` owns rows ``r, r + W, r + 2W, ...``, padded with all-ignored rows to
    ``ceil(N / W)`` rows so every rank runs the same number of batches; over all ranks every example is
    seen exactly once.
    """

    def __init__(self, examples: Examples, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        rows = math.ceil(len(examples) / world_size)
        owned = np.arange(rows) * world_size + rank
        mine = examples.rows(owned[owned < len(examples)])
        seq_len = examples.input.shape[1]
        self.examples = mine.concat(Examples.empty(rows - len(mine), seq_len))
        self.batch_size = batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        for start in range(0, len(self.examples), self.batch_size):
            yield self.examples.rows(slice(start, start + self.batch_size)).to_batch()


# ----------------------------------------------------------------------------------------------- tasks


class SyntheticTask(Protocol):
    """One probe's generator (:mod:`.induction`, :mod:`.selective_copy`, :mod:`.mqar`, :mod:`.passkey`): the
    row shape, the examples of a split, the names of its answer buckets, and the size of its evaluation sets
    when the task fixes it (``None``: the data module's ``num_val_examples`` / ``num_test_examples``)."""

    seq_len: int
    vocab_size: int
    eval_examples: int | None

    def generate(self, rng: np.random.Generator, num_examples: int, split: str) -> Examples:
        """``num_examples`` examples of ``split`` (``"train"``, ``"validation"``, ``"test"``) from ``rng``."""
        ...

    def bucket_names(self, split: str) -> list[str]:
        """The name of each bucket id of ``split``."""
        ...


class GapTask:
    """What the probes bucketed by distance share (:mod:`.induction`, :mod:`.selective_copy`, :mod:`.mqar`): the
    row shape, log-spaced gap buckets (:func:`gap_edges` from ``first_gap``, the same for every split), and
    evaluation sets sized by the data module. A subclass checks its options and generates the examples."""

    eval_examples: int | None = None

    def __init__(self, seq_len: int, vocab_size: int, first_gap: int) -> None:
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.edges = gap_edges(seq_len, first_gap)

    def bucket_names(self, split: str) -> list[str]:
        return gap_bucket_names(self.edges)


# ----------------------------------------------------------------------------------------------- data module

DEFAULT_EVAL_EXAMPLES = 1000


class SyntheticDataModule(RootedDataModule):
    """A seeded synthetic probe: a task (:class:`SyntheticTask`) with the loader options every probe shares;
    training batches on the fly, fixed validation and test sets (module docstring for the seeding).

    Args:
        task: the task's class (or a partial of it) with its own options; built here with ``seq_len`` and
            ``vocab_size`` when they are given (``None``: the task's defaults).
        seq_len, vocab_size: the row shape (the data contract's keys).
        batch_size: training rows per rank; ``eval_batch_size``: evaluation rows per batch.
        num_val_examples, num_test_examples: evaluation set sizes (``None``: the task's ``eval_examples``,
            else 1000); ``steps_per_epoch``; ``seed`` (training batches), ``val_seed``, ``test_seed``.

    Batches: ``input``/``target``/``bucket`` ``(B, seq_len)`` int64, ``reset`` ``(B,)`` bool
    (:mod:`tvq_exp.batch`).
    """

    @checked
    def __init__(
        self,
        task: Callable[..., SyntheticTask],
        seq_len: PositiveInt | None = None,
        vocab_size: Annotated[int, AtLeast(2)] | None = None,
        batch_size: PositiveInt = 64,
        eval_batch_size: PositiveInt = 64,
        num_val_examples: PositiveInt | None = None,
        num_test_examples: PositiveInt | None = None,
        steps_per_epoch: PositiveInt = 1000,
        seed: int = 0,
        val_seed: int = 1,
        test_seed: int = 2,
        kind: Annotated[str, OneOf("synthetic")] = "synthetic",
    ) -> None:
        shape = {"seq_len": seq_len, "vocab_size": vocab_size}
        built = task(**{name: value for name, value in shape.items() if value is not None})
        super().__init__(None, kind, built.seq_len, built.vocab_size, batch_size, eval_batch_size)
        self.task = built
        fixed = self.task.eval_examples or DEFAULT_EVAL_EXAMPLES
        self.num_examples = {"validation": num_val_examples or fixed, "test": num_test_examples or fixed}
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.split_seeds = {"validation": val_seed, "test": test_seed}
        self.eval_sets: dict[str, Examples] = {}

    @property
    def context_len(self) -> int:
        """Positions a model sees from a fresh state: one whole sequence."""
        return self.seq_len

    def generate(self, rng: np.random.Generator, num_examples: int, split: str) -> Examples:
        """``num_examples`` examples of ``split`` from ``rng`` (the task's)."""
        return self.task.generate(rng, num_examples, split)

    def bucket_names(self, split: str) -> list[str]:
        """The task's answer buckets of ``split`` (the data contract)."""
        return self.task.bucket_names(split)

    def setup(self, stage: str | None = None) -> None:
        for split in EVAL_SPLITS:
            self.eval_examples(split)

    def eval_examples(self, split: str) -> Examples:
        """The fixed evaluation set of ``split`` (generated on first use, then kept)."""
        if split not in EVAL_SPLITS:
            raise ValueError(f"split={split!r}: must be one of {', '.join(EVAL_SPLITS)}")
        if split not in self.eval_sets:
            rng = np.random.default_rng([self.split_seeds[split], EVAL_STREAM, SPLIT_STREAMS[split]])
            self.eval_sets[split] = self.generate(rng, self.num_examples[split], split)
        return self.eval_sets[split]

    @property
    def eval_checksums(self) -> dict[str, str]:
        """SHA-256 of each evaluation set (:meth:`Examples.checksum`), by split."""
        return {split: self.eval_examples(split).checksum() for split in EVAL_SPLITS}

    def train_sampler(self, rank: int = 0) -> SyntheticTrainSampler:
        """The training sampler of ``rank``."""
        return SyntheticTrainSampler(
            lambda rng, size: self.generate(rng, size, "train"),
            self.batch_size,
            self.steps_per_epoch,
            self.seed,
            rank,
        )

    def eval_loader(self, split: str, rank: int = 0, world_size: int = 1) -> SyntheticEvalLoader:
        """Batches of the evaluation set of ``split`` for ``rank`` of ``world_size``."""
        return SyntheticEvalLoader(self.eval_examples(split), self.eval_batch_size, rank, world_size)

    def train_dataloader(self) -> TrainLoader:
        rank, _ = self.distributed()
        return TrainLoader(self.train_sampler(rank))

    def val_dataloader(self) -> SyntheticEvalLoader:
        return self.eval_loader("validation", *self.distributed())

    def test_dataloader(self) -> SyntheticEvalLoader:
        return self.eval_loader("test", *self.distributed())
