"""Passkey retrieval in real text: a random decimal key hidden at a chosen depth of a Gutenberg passage.

One example of context length ``L`` (bytes the model reads, vocabulary 256) is the byte string
``S = filler[:p] + NEEDLE + filler[p:] + QUESTION + key`` of ``L + 1`` bytes::

    ...passage...
    The pass key is 48213. Remember it. 48213 is the pass key.
    ...passage...
    What is the pass key? The pass key is 48213

``input = S[:L]``, and the targets are the key's ``key_digits`` bytes at the last ``key_digits`` positions
(teacher forced: digit ``i`` is predicted after reading digits ``0 .. i-1``); every other target is
:data:`~tvq_exp.batch.IGNORE_INDEX`. The key has exactly ``key_digits`` digits (the first is not 0).

The filler is one uniform random window of a single book (never across books) of the split's books in
``CATALOG.tsv`` (training examples from the train books, the validation and test sets from theirs); windows
that contain "pass key" are drawn again. The needle goes at the line start of the filler nearest to
``depth * len(filler)`` (the filler's two ends count as line starts), so it sits at the requested depth to
within one line; depth 0 puts it first, depth 1 right before the question.

Rows are ``seq_len = max(lengths)`` long: a shorter example is *left*-padded with byte 0 (never in the
books), so the question and the answer end every row; padding has target ``IGNORE_INDEX`` and bucket -1
and never takes loss. Buckets are the ``(length, depth)`` cells, id ``length_index * len(depths) +
depth_index``, named like ``"len_1024_depth_0.50"``. Training rows draw a cell uniformly; each evaluation
set holds ``eval_examples_per_cell`` examples of every cell (example ``i`` is cell ``i % cells``). An
example is right when all its digits are (``BucketAccuracy``'s sequence accuracy); its per-position
accuracy is the per-digit accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np

from tvq_exp.data.paths import data_root
from tvq_exp.data.synthetic.base import Examples, draw_cells
from tvq_exp.data.text.files import read_bytes
from tvq_exp.data.text.gutenberg import GutenbergCorpus
from tvq_exp.options import OneOf, OptionError, PositiveInt, checked

NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\nWhat is the pass key? The pass key is "
BANNED = b"pass key"
BYTE_VOCAB_SIZE = 256


class BookPool:
    """The books of one split (memory-mapped); uniform random windows inside a single book."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.books = [read_bytes(path) for path in self.paths]
        self.sizes = np.array([len(book) for book in self.books], dtype=np.int64)

    def window(self, rng: np.random.Generator, length: int) -> bytes:
        """``length`` bytes at a uniform random start among all windows that fit in one book, drawn again
        while the window contains "pass key" (any case)."""
        starts = np.maximum(self.sizes - length + 1, 0)
        if starts.sum() == 0:
            raise ValueError(f"no book of {len(self.paths)} holds {length} bytes")
        while True:
            book = int(rng.choice(len(starts), p=starts / starts.sum()))
            offset = int(rng.integers(starts[book]))
            text = bytes(self.books[book][offset : offset + length])
            if BANNED not in text.lower():
                return text


class BookTask:
    """What the probes over Gutenberg text share (:class:`PasskeyTask`,
    :class:`~tvq_exp.data.text.repeat.RepeatTask`): the books of each split of ``corpus_path`` (``CATALOG.tsv``)
    under the data root ``root`` (``None``: ``$TVQ_DATA_DIR``, else ``./data``), each split's opened on first
    use."""

    def __init__(self, corpus_path: str, root: str | None) -> None:
        self.corpus = GutenbergCorpus(corpus_path)
        self.root = root
        self.pools: dict[str, BookPool] = {}

    def pool(self, split: str) -> BookPool:
        """The books of ``split`` (``"train"``, ``"validation"`` or ``"test"``), opened on first use."""
        if split not in self.pools:
            self.pools[split] = BookPool(self.corpus.split_files(data_root(self.root))[split])
        return self.pools[split]


def needle(key: str) -> bytes:
    """The needle sentence carrying ``key``, with its surrounding newlines."""
    return NEEDLE.format(key=key).encode()


def shortest_length(key_digits: int) -> int:
    """The shortest context length: needle, question and key with one byte of filler."""
    return len(needle("0" * key_digits)) + len(QUESTION) + key_digits


def filler_length(length: int, key_digits: int) -> int:
    """Filler bytes in an example of context length ``length``: ``S`` minus needle, question and key."""
    return length + 1 - shortest_length(key_digits)


def needle_offset(filler: bytes, depth: float) -> int:
    """The line start of ``filler`` nearest to ``depth * len(filler)`` (ends included; ties go earlier)."""
    newlines = np.flatnonzero(np.frombuffer(filler, dtype=np.uint8) == ord("\n")) + 1
    starts = np.unique(np.concatenate([[0, len(filler)], newlines]))
    target = np.floor(depth * len(filler) + 0.5)
    return int(starts[np.argmin(np.abs(starts - target))])


def passkey_text(filler: bytes, key: str, depth: float) -> bytes:
    """The example's byte string ``S`` (module docstring): ``len(filler) + needle + question + key`` bytes."""
    split = needle_offset(filler, depth)
    return filler[:split] + needle(key) + filler[split:] + QUESTION.encode() + key.encode()


def random_key(rng: np.random.Generator, digits: int) -> str:
    """A decimal key of exactly ``digits`` digits."""
    first = int(rng.integers(1, 10))
    return str(first) + "".join(str(int(d)) for d in rng.integers(0, 10, size=digits - 1))


class PasskeyTask(BookTask):
    """Passkey retrieval over the Gutenberg books (module docstring for the example layout), a task of
    :class:`~tvq_exp.data.synthetic.base.SyntheticDataModule`.

    Options: ``lengths`` (distinct context lengths, each long enough for needle, question and key),
    ``depths`` (distinct fractions in ``[0, 1]``), ``key_digits``, ``seq_len`` (``None`` = ``max(lengths)``),
    ``eval_examples_per_cell`` (the evaluation sets hold every cell that often), ``corpus_path`` (the
    Gutenberg folder under the data root), ``root`` (the data root; ``None``: ``$TVQ_DATA_DIR``, else
    ``./data``). Examples: ``(N, seq_len)`` arrays.
    """

    @checked
    def __init__(
        self,
        lengths: Sequence[int] = (256, 512, 1024, 2048),
        depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
        key_digits: PositiveInt = 5,
        seq_len: PositiveInt | None = None,
        eval_examples_per_cell: PositiveInt = 10,
        corpus_path: str = "text/gutenberg",
        vocab_size: Annotated[int, OneOf(BYTE_VOCAB_SIZE)] = BYTE_VOCAB_SIZE,
        root: str | None = None,
    ) -> None:
        super().__init__(corpus_path, root)
        self.lengths = tuple(int(length) for length in lengths)
        self.depths = tuple(float(depth) for depth in depths)
        self.key_digits = key_digits
        self.check_cells()
        seq_len = max(self.lengths) if seq_len is None else seq_len
        if seq_len < max(self.lengths):
            raise OptionError(
                "seq_len", seq_len, f"must be >= max(lengths) = {max(self.lengths)}", type(self)
            )
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.eval_examples = eval_examples_per_cell * len(self.lengths) * len(self.depths)

    def check_cells(self) -> None:
        """Raise :class:`OptionError` for bad ``lengths`` or ``depths``."""
        owner = type(self)
        shortest = shortest_length(self.key_digits)
        if not self.lengths or len(set(self.lengths)) != len(self.lengths) or min(self.lengths) < shortest:
            allowed = (
                f"must be distinct lengths >= {shortest} (needle, question and a {self.key_digits}-digit key)"
            )
            raise OptionError("lengths", list(self.lengths), allowed, owner)
        names = self.bucket_names("train")
        if not self.depths or len(set(names)) != len(names) or not all(0 <= d <= 1 for d in self.depths):
            allowed = "must be distinct fractions in [0, 1] (distinct to 2 decimals)"
            raise OptionError("depths", list(self.depths), allowed, owner)

    def bucket_names(self, split: str) -> list[str]:
        return [f"len_{length}_depth_{depth:.2f}" for length in self.lengths for depth in self.depths]

    def generate(self, rng: np.random.Generator, num_examples: int, split: str) -> Examples:
        cells = draw_cells(rng, num_examples, len(self.lengths) * len(self.depths), split)
        examples = Examples.empty(num_examples, self.seq_len)
        for row, cell in enumerate(cells.tolist()):
            length, depth = self.lengths[cell // len(self.depths)], self.depths[cell % len(self.depths)]
            key = random_key(rng, self.key_digits)
            filler = self.pool(split).window(rng, filler_length(length, self.key_digits))
            text = np.frombuffer(passkey_text(filler, key, depth), dtype=np.uint8)
            examples.input[row, self.seq_len - length :] = text[:-1]
            examples.target[row, self.seq_len - self.key_digits :] = text[-self.key_digits :]
            examples.bucket[row, self.seq_len - self.key_digits :] = cell
        return examples
