"""The byte-level language-modelling data module over a :class:`~tvq_exp.data.text.corpus.ByteCorpus`."""

from __future__ import annotations

from typing import Annotated

import numpy as np

from tvq_exp.data.module import RootedDataModule
from tvq_exp.data.paths import CorruptFileError, resolve
from tvq_exp.data.samplers import (
    EvalSegmentSampler,
    RandomWindowSampler,
    StreamSampler,
    TBPTTSampler,
    TrainLoader,
    check_split_size,
)
from tvq_exp.data.samplers.evaluation import PROTOCOLS
from tvq_exp.data.samplers.tbptt import check_sequence_len
from tvq_exp.data.text.corpus import SPLITS, ByteCorpus
from tvq_exp.options import OneOf, OptionError, PositiveInt, checked

TEXT_VOCAB_SIZE = 256
SAMPLERS = ("random", "stream", "tbptt")


class TextDataModule(RootedDataModule):
    """Byte-level language modelling over a :class:`~tvq_exp.data.text.corpus.ByteCorpus`.

    Training (``sampler``):

    - ``random``: independent windows of ``seq_len`` (seeded by ``seed`` + rank + epoch;
      ``steps_per_epoch`` defaults to ``len(train) // (batch_size * seq_len * world_size)``), each from a
      fresh state;
    - ``tbptt``: the paper's truncated BPTT (:class:`~tvq_exp.data.samplers.tbptt.TBPTTSampler`): sequences of
      ``sequence_len`` in a seeded order covering the corpus, each trained as ``sequence_len / seq_len``
      consecutive updates with the state carried between them and reset with every sequence;
    - ``stream``: Transformer-XL contiguous streams, ``batch_size`` per rank, the state carried and reset
      every ``reset_every`` tokens (:class:`~tvq_exp.data.samplers.stream.StreamSampler`).

    Validation/test cover the whole split once in ``eval_batch_size`` contiguous streams (a job-wide count,
    split over ranks) of ``seq_len`` segments, the state reset per ``eval_protocol``: ``segment`` (every
    segment, the official protocol), ``sequence`` (every ``sequence_len``), ``split`` (carried across each
    stream); :meth:`split_tokens` gives the number of targets. Batches: ``input``/``target`` ``(B, T)`` int64
    with ``T = seq_len``, ``reset`` ``(B,)`` bool, ``position`` ``(B,)`` int64 (tokens since the last reset).
    """

    @checked
    def __init__(
        self,
        corpus: ByteCorpus,
        seq_len: PositiveInt = 512,
        batch_size: PositiveInt = 16,
        eval_batch_size: PositiveInt = 16,
        sampler: Annotated[str, OneOf(*SAMPLERS)] = "random",
        seed: int = 0,
        steps_per_epoch: PositiveInt | None = None,
        random_offset: bool = True,
        vocab_size: Annotated[int, OneOf(TEXT_VOCAB_SIZE)] = TEXT_VOCAB_SIZE,
        kind: Annotated[str, OneOf("text")] = "text",
        root: str | None = None,
        sequence_len: PositiveInt | None = None,
        reset_every: PositiveInt | None = None,
        eval_protocol: Annotated[str, OneOf(*PROTOCOLS)] = "segment",
    ) -> None:
        super().__init__(root, kind, seq_len, vocab_size, batch_size, eval_batch_size)
        if sampler == "tbptt" or eval_protocol == "sequence":
            check_sequence_len(sequence_len, seq_len, type(self))
        self.sequence_len, self.reset_every, self.eval_protocol = sequence_len, reset_every, eval_protocol
        self.corpus = corpus
        self.sampler = sampler
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.random_offset = random_offset
        self.splits: dict[str, np.ndarray] | None = None

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """Gradient accumulation sums consecutive batches; with TBPTT or streams those continue the same
        sequences, so an optimiser step would not see a batch of independent sequences: refused."""
        if accumulate_grad_batches > 1 and self.sampler in ("tbptt", "stream"):
            raise OptionError(
                "sampler", self.sampler, f"cannot use gradient accumulation (trainer.accumulate_grad_batches="
                f"{accumulate_grad_batches}): consecutive batches continue the same sequences; scale the batch with "
                "data.batch_size or more devices", type(self),
            )  # fmt: skip

    @property
    def context_len(self) -> int:
        """Positions a model sees from a fresh state in training: a TBPTT sequence, a stream between resets,
        or one window."""
        if self.sampler == "tbptt":
            return int(self.sequence_len)
        if self.sampler == "stream" and self.reset_every is not None:
            return max(self.seq_len, self.reset_every)
        return self.seq_len

    def prepare_data(self) -> None:
        self.corpus.prepare(self.root)

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        splits = self.corpus.load(self.root)
        for split in SPLITS:
            try:
                check_split_size(split, len(splits[split]), self.seq_len)
            except ValueError as error:
                raise CorruptFileError(
                    f"{error} in {self.corpus_source()}: the corpus is smaller than one sequence; "
                    "lower data.seq_len or use a larger corpus"
                ) from None
        self.splits = splits

    def corpus_source(self) -> str:
        """The corpus file or folder (its ``path`` under the data root), else its name: for messages."""
        path = getattr(self.corpus, "path", None)
        if path:
            return str(resolve(path, self.root))
        return f"{getattr(self.corpus, 'name', type(self.corpus).__name__)} (data root {self.root})"

    def split(self, name: str) -> np.ndarray:
        """The bytes of split ``name``, ``(n,)`` uint8 (after :meth:`setup`)."""
        if self.splits is None:
            raise RuntimeError("call setup() before reading splits")
        return self.splits[name]

    def train_sampler(self, rank: int, world_size: int) -> RandomWindowSampler | StreamSampler | TBPTTSampler:
        """The training sampler this configuration uses, for the given rank."""
        data = self.split("train")
        if self.sampler == "stream":
            return StreamSampler(
                data, self.seq_len, self.batch_size, self.seed, rank, world_size,
                random_offset=self.random_offset, reset_every=self.reset_every,
            )  # fmt: skip
        if self.sampler == "tbptt":
            return TBPTTSampler(
                data, self.seq_len, int(self.sequence_len), self.batch_size, self.seed, rank, world_size
            )
        steps = self.steps_per_epoch or max(1, len(data) // (self.batch_size * self.seq_len * world_size))
        return RandomWindowSampler(data, self.seq_len, self.batch_size, steps, self.seed, rank, world_size)

    def eval_sampler(self, split: str, rank: int = 0, world_size: int = 1) -> EvalSegmentSampler:
        """Whole-split evaluation sampler of ``split`` for the given rank."""
        return EvalSegmentSampler(
            self.split(split),
            self.seq_len,
            self.eval_batch_size,
            rank,
            world_size,
            self.eval_protocol,
            self.sequence_len,
        )

    def split_tokens(self, split: str) -> int:
        """Number of evaluation targets in ``split`` (all ranks together)."""
        return EvalSegmentSampler.count_targets(len(self.split(split)), self.eval_batch_size)

    def train_dataloader(self) -> TrainLoader:
        return TrainLoader(self.train_sampler(*self.distributed()))

    def val_dataloader(self) -> EvalSegmentSampler:
        return self.eval_sampler("validation", *self.distributed())

    def test_dataloader(self) -> EvalSegmentSampler:
        return self.eval_sampler("test", *self.distributed())
