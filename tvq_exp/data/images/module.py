"""The pixel-level image-modelling data module over an :class:`~tvq_exp.data.images.sources.ImageSource`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

from torch.utils.data import DataLoader

from tvq_exp.data.images.sources import ImageSource
from tvq_exp.data.images.tokens import ImageArray, ImageTokenDataset
from tvq_exp.data.module import RootedDataModule
from tvq_exp.data.samplers.images import ImageSampler
from tvq_exp.data.samplers.loader import TrainLoader
from tvq_exp.options import AtLeast, NonNegativeInt, OneOf, OptionError, PositiveInt, checked


class ImageDataModule(RootedDataModule):
    """Pixel-level image modelling over an :class:`~tvq_exp.data.images.sources.ImageSource`.

    Each image ``(H, W, C)`` becomes ``T = H*W*C`` tokens (channels interleaved); ``input = [BOS] +
    tokens[:-1]``, ``target = tokens``, ``BOS = levels = vocab_size - 1``; ``reset`` is always True. The
    configured ``image_shape``, ``seq_len`` and ``vocab_size`` are checked against the source. Training
    batches come in a seeded, resumable order, disjoint per rank (:class:`~tvq_exp.data.samplers.images.ImageSampler`);
    with ``update_len`` each batch of images is trained as ``seq_len / update_len`` TBPTT updates with the
    state carried (the official ImageNet64 protocol). Evaluation reads whole images.
    """

    @checked
    def __init__(
        self,
        source: ImageSource,
        image_shape: Sequence[int],
        seq_len: PositiveInt,
        vocab_size: Annotated[int, AtLeast(2)],
        batch_size: PositiveInt = 16,
        eval_batch_size: PositiveInt = 16,
        num_workers: NonNegativeInt = 0,
        seed: int = 0,
        kind: Annotated[str, OneOf("image")] = "image",
        root: str | None = None,
        update_len: PositiveInt | None = None,
    ) -> None:
        super().__init__(root, kind, seq_len, vocab_size, batch_size, eval_batch_size)
        shape = tuple(int(size) for size in image_shape)
        owner = type(self)
        if shape != tuple(source.shape):
            raise OptionError(
                "image_shape", list(shape), f"{source.name} images are {list(source.shape)}", owner
            )
        if seq_len != math.prod(shape):
            raise OptionError(
                "seq_len", seq_len, f"must be H*W*C = {math.prod(shape)} for {source.name}", owner
            )
        if vocab_size != source.levels + 1:
            raise OptionError(
                "vocab_size", vocab_size, f"must be levels + 1 (BOS) = {source.levels + 1}", owner
            )
        if update_len is not None and seq_len % update_len:
            raise OptionError(
                "update_len", update_len, f"must divide seq_len={seq_len} (TBPTT over an image)", owner
            )
        self.update_len = update_len
        self.source = source
        self.image_shape = shape
        self.num_workers = num_workers
        self.seed = seed
        self.images: dict[str, ImageArray] | None = None

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """With TBPTT over images (``update_len``) consecutive batches continue the same images: accumulating
        them is refused (scale the batch with ``data.batch_size`` or more devices)."""
        if accumulate_grad_batches > 1 and self.update_len is not None:
            raise OptionError(
                "update_len", self.update_len, "cannot be combined with gradient accumulation "
                f"(trainer.accumulate_grad_batches={accumulate_grad_batches})", type(self),
            )  # fmt: skip

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

    def _loader(self, split: str, batch_size: int) -> DataLoader:
        """Whole images of an evaluation split, in order."""
        return DataLoader(
            self.dataset(split),
            batch_size=batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> TrainLoader:
        sampler = ImageSampler(
            self.dataset("train"),
            self.seq_len,
            self.batch_size,
            self.seed,
            *self.distributed(),
            self.update_len,
        )
        return TrainLoader(sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size)
