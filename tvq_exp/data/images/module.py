"""The pixel-level image-modelling data module over an :class:`~tvq_exp.data.images.sources.ImageSource`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from torch.utils.data import DataLoader

from tvq_exp.data.images.sources import ImageSource
from tvq_exp.data.images.tokens import ImageArray, ImageTokenDataset
from tvq_exp.data.module import RootedDataModule
from tvq_exp.options import AtLeast, OneOf, OptionError, checked


class ImageDataModule(RootedDataModule):
    """Pixel-level image modelling over an :class:`~tvq_exp.data.images.sources.ImageSource`.

    Each image ``(H, W, C)`` becomes ``T = H*W*C`` tokens (channels interleaved); ``input = [BOS] +
    tokens[:-1]``, ``target = tokens``, ``BOS = levels = vocab_size - 1``; ``reset`` is always True. The
    configured ``image_shape``, ``seq_len`` and ``vocab_size`` are checked against the source. Training
    batches are shuffled (Lightning adds a DistributedSampler under DDP).
    """

    @checked
    def __init__(
        self,
        source: ImageSource,
        image_shape: Sequence[int],
        seq_len: Annotated[int, AtLeast(1)],
        vocab_size: Annotated[int, AtLeast(2)],
        batch_size: Annotated[int, AtLeast(1)] = 16,
        eval_batch_size: Annotated[int, AtLeast(1)] = 16,
        num_workers: Annotated[int, AtLeast(0)] = 0,
        seed: int = 0,
        kind: Annotated[str, OneOf("image")] = "image",
        root: str | None = None,
    ) -> None:
        super().__init__(root)
        shape = tuple(int(size) for size in image_shape)
        owner = type(self)
        if shape != tuple(source.shape):
            raise OptionError("image_shape", list(shape), f"{source.name} images are {list(source.shape)}", owner)
        if seq_len != math.prod(shape):
            raise OptionError("seq_len", seq_len, f"must be H*W*C = {math.prod(shape)} for {source.name}", owner)
        if vocab_size != source.levels + 1:
            raise OptionError("vocab_size", vocab_size, f"must be levels + 1 (BOS) = {source.levels + 1}", owner)
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
    def context_len(self) -> int:
        """Positions a model sees from a fresh state: one whole image."""
        return self.seq_len

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
