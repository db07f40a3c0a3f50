"""LightningDataModules for byte corpora and image datasets.

Construction is cheap (no file access): downloads happen in ``prepare_data`` and files are read in
``setup``. Batches are ``{"input": (B, T) int64, "target": (B, T) int64 (-100 = ignore), "reset": (B,) bool}``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from tvq_exp.data.bytes import SPLITS, ByteCorpus
from tvq_exp.data.images import ImageArray, ImageSource, ImageTokenDataset
from tvq_exp.data.paths import CorruptFileError, data_root, resolve
from tvq_exp.data.samplers import (
    EvalSegmentSampler,
    RandomWindowSampler,
    StreamSampler,
    TrainLoader,
    check_split_size,
)

TEXT_VOCAB_SIZE = 256
SAMPLERS = ("random", "stream")


def _positive(**values: int) -> None:
    """Raise ``ValueError`` for any non-positive integer setting."""
    for name, value in values.items():
        if int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")


class _RootedDataModule(L.LightningDataModule):
    """Shared plumbing: the data root and the (rank, world size) of this process."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        super().__init__()
        self.root_override = root

    @property
    def root(self) -> Path:
        """The data root, resolved when used (``root`` arg, else ``$TVQ_DATA_DIR``, else ``./data``)."""
        return data_root(self.root_override)

    def distributed(self) -> tuple[int, int]:
        """``(global_rank, world_size)`` from the attached trainer, else ``(0, 1)``."""
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size


class TextDataModule(_RootedDataModule):
    """Byte-level language modelling over a :class:`~tvq_exp.data.bytes.ByteCorpus`.

    Training (``sampler``): ``"random"`` windows (seeded by ``seed`` + rank + epoch; ``steps_per_epoch``
    defaults to ``len(train) // (batch_size * seq_len * world_size)``) or ``"stream"`` (Transformer-XL
    contiguous streams, ``batch_size`` per rank; resumable through the loader's ``state_dict``).
    Validation/test cover the whole split once in ``eval_batch_size`` contiguous streams (a job-wide count,
    split over ranks) of ``seq_len`` segments; :meth:`split_tokens` gives the number of targets.
    Batches: ``input``/``target`` ``(B, T)`` int64 with ``T = seq_len``, ``reset`` ``(B,)`` bool.
    """

    def __init__(
        self,
        corpus: ByteCorpus,
        seq_len: int = 512,
        batch_size: int = 16,
        eval_batch_size: int = 16,
        sampler: str = "random",
        seed: int = 0,
        steps_per_epoch: int | None = None,
        random_offset: bool = True,
        vocab_size: int = TEXT_VOCAB_SIZE,
        kind: str = "text",
        root: str | None = None,
    ) -> None:
        super().__init__(root)
        _positive(seq_len=seq_len, batch_size=batch_size, eval_batch_size=eval_batch_size)
        if steps_per_epoch is not None:
            _positive(steps_per_epoch=steps_per_epoch)
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if vocab_size != TEXT_VOCAB_SIZE or kind != "text":
            raise ValueError(
                f"byte corpora need vocab_size={TEXT_VOCAB_SIZE} and kind='text', got {vocab_size}, {kind!r}"
            )
        self.corpus = corpus
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.sampler = sampler
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.random_offset = random_offset
        self.vocab_size = vocab_size
        self.kind = kind
        self.splits: dict[str, np.ndarray] | None = None

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

    def train_sampler(self, rank: int, world_size: int) -> RandomWindowSampler | StreamSampler:
        """The training sampler this configuration uses, for the given rank."""
        data = self.split("train")
        if self.sampler == "stream":
            return StreamSampler(
                data,
                self.seq_len,
                self.batch_size,
                self.seed,
                rank,
                world_size,
                random_offset=self.random_offset,
            )
        steps = self.steps_per_epoch or max(1, len(data) // (self.batch_size * self.seq_len * world_size))
        return RandomWindowSampler(data, self.seq_len, self.batch_size, steps, self.seed, rank, world_size)

    def eval_sampler(self, split: str, rank: int = 0, world_size: int = 1) -> EvalSegmentSampler:
        """Whole-split evaluation sampler of ``split`` for the given rank."""
        return EvalSegmentSampler(self.split(split), self.seq_len, self.eval_batch_size, rank, world_size)

    def split_tokens(self, split: str) -> int:
        """Number of evaluation targets in ``split`` (all ranks together)."""
        return EvalSegmentSampler.count_targets(len(self.split(split)), self.eval_batch_size)

    def train_dataloader(self) -> TrainLoader:
        return TrainLoader(self.train_sampler(*self.distributed()))

    def val_dataloader(self) -> EvalSegmentSampler:
        return self.eval_sampler("validation", *self.distributed())

    def test_dataloader(self) -> EvalSegmentSampler:
        return self.eval_sampler("test", *self.distributed())


class ImageDataModule(_RootedDataModule):
    """Pixel-level image modelling over an :class:`~tvq_exp.data.images.ImageSource`.

    Each image ``(H, W, C)`` becomes ``T = H*W*C`` tokens (channels interleaved); ``input = [BOS] +
    tokens[:-1]``, ``target = tokens``, ``BOS = levels = vocab_size - 1``; ``reset`` is always True. The
    configured ``image_shape``, ``seq_len`` and ``vocab_size`` are checked against the source. Training
    batches are shuffled (Lightning adds a DistributedSampler under DDP).
    """

    def __init__(
        self,
        source: ImageSource,
        image_shape: Sequence[int],
        seq_len: int,
        vocab_size: int,
        batch_size: int = 16,
        eval_batch_size: int = 16,
        num_workers: int = 0,
        seed: int = 0,
        kind: str = "image",
        root: str | None = None,
    ) -> None:
        super().__init__(root)
        _positive(batch_size=batch_size, eval_batch_size=eval_batch_size)
        shape = tuple(int(size) for size in image_shape)
        if shape != tuple(source.shape):
            raise ValueError(f"image_shape {list(shape)} does not match {source.name}'s {list(source.shape)}")
        if seq_len != math.prod(shape):
            raise ValueError(f"seq_len must be H*W*C = {math.prod(shape)} for {source.name}, got {seq_len}")
        if vocab_size != source.levels + 1:
            raise ValueError(
                f"vocab_size must be levels + 1 (BOS) = {source.levels + 1} for {source.name}, got {vocab_size}"
            )
        if kind != "image":
            raise ValueError(f"image datasets need kind='image', got {kind!r}")
        self.source = source
        self.image_shape = shape
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.kind = kind
        self.images: dict[str, ImageArray] | None = None

    @property
    def bos_id(self) -> int:
        """The BOS token id (= number of pixel levels)."""
        return self.source.levels

    def prepare_data(self) -> None:
        self.source.prepare(self.root)

    def setup(self, stage: str | None = None) -> None:
        if self.images is None:
            self.images = self.source.load(self.root)

    def dataset(self, split: str) -> ImageTokenDataset:
        """Token dataset of ``split`` (after :meth:`setup`)."""
        if self.images is None:
            raise RuntimeError("call setup() before reading splits")
        return ImageTokenDataset(self.images[split], self.source.levels)

    def split_tokens(self, split: str) -> int:
        """Number of targets in ``split``: images times ``seq_len``."""
        return len(self.dataset(split)) * self.seq_len

    def _loader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        return DataLoader(
            self.dataset(split),
            batch_size=batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed) if train else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", self.eval_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, train=False)
