"""Data: byte corpora, image pixels, downloading and stream sampling (see DESIGN.md section 5)."""

from tvq_exp.data.bytes import (
    ByteCorpus,
    GutenbergCorpus,
    KJVCorpus,
    MahoneyCorpus,
    PG19Corpus,
    SingleFileCorpus,
    TextFilesCorpus,
    read_bytes,
)
from tvq_exp.data.download import ChecksumError, download
from tvq_exp.data.images import (
    Cifar10Images,
    DigitsImages,
    IdxImages,
    ImageArray,
    Imagenet64Images,
    ImageSource,
    ImageTokenDataset,
    flatten_image,
    unflatten_tokens,
)
from tvq_exp.data.module import ImageDataModule, TextDataModule
from tvq_exp.data.paths import ENV_VAR, CorruptFileError, DataNotFoundError, data_root
from tvq_exp.data.samplers import (
    IGNORE_INDEX,
    EvalSegmentSampler,
    RandomWindowSampler,
    StreamSampler,
    TrainLoader,
)

__all__ = [
    "ENV_VAR",
    "IGNORE_INDEX",
    "ByteCorpus",
    "ChecksumError",
    "Cifar10Images",
    "CorruptFileError",
    "DataNotFoundError",
    "DigitsImages",
    "EvalSegmentSampler",
    "GutenbergCorpus",
    "IdxImages",
    "ImageArray",
    "ImageDataModule",
    "ImageSource",
    "ImageTokenDataset",
    "Imagenet64Images",
    "KJVCorpus",
    "MahoneyCorpus",
    "PG19Corpus",
    "RandomWindowSampler",
    "SingleFileCorpus",
    "StreamSampler",
    "TextDataModule",
    "TextFilesCorpus",
    "TrainLoader",
    "data_root",
    "download",
    "flatten_image",
    "read_bytes",
    "unflatten_tokens",
]
