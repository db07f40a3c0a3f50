"""Data: byte corpora (:mod:`.text`), images (:mod:`.images`), samplers (:mod:`.samplers`), downloads and the
data root (:mod:`.download`, :mod:`.paths`). Batches follow :mod:`tvq_exp.batch`."""

from tvq_exp.data.download import ChecksumError, download
from tvq_exp.data.images import ImageDataModule
from tvq_exp.data.paths import ENV_VAR, CorruptFileError, DataNotFoundError, data_root
from tvq_exp.data.text import TextDataModule

__all__ = [
    "ENV_VAR",
    "ChecksumError",
    "CorruptFileError",
    "DataNotFoundError",
    "ImageDataModule",
    "TextDataModule",
    "data_root",
    "download",
]
