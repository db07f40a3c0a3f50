"""Byte-level text: corpora (enwik8/text8, Gutenberg, PG-19, local files), reading and splitting, the data module."""

from tvq_exp.data.text.corpus import SPLITS, ByteCorpus
from tvq_exp.data.text.enwik8 import MahoneyCorpus
from tvq_exp.data.text.files import read_bytes
from tvq_exp.data.text.gutenberg import GutenbergCorpus
from tvq_exp.data.text.local import KJVCorpus, SingleFileCorpus, TextFilesCorpus
from tvq_exp.data.text.module import TextDataModule
from tvq_exp.data.text.pg19 import PG19Corpus

__all__ = [
    "SPLITS",
    "ByteCorpus",
    "GutenbergCorpus",
    "KJVCorpus",
    "MahoneyCorpus",
    "PG19Corpus",
    "SingleFileCorpus",
    "TextDataModule",
    "TextFilesCorpus",
    "read_bytes",
]
