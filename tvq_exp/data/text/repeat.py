"""The repeat probe: Gutenberg text in which a later passage repeats an earlier one at a known distance.

One example is a window of ``T + 1`` bytes of one book (the split's books of ``CATALOG.tsv``: training
examples from the train books, the validation and test sets from theirs) in which the ``span`` bytes at
``p + d .. p + d + span - 1`` are overwritten by a copy of the bytes at ``p .. p + span - 1``::

    ... text ... [span bytes: the source] ... text, d - span bytes ... [the same span bytes] ... text ...
                 ^ p                                                  ^ p + d

``span_content`` says what the span holds: ``"text"``, the book's own bytes (a copy of natural text, which a
language model already predicts in part), or ``"random"``, uniform random bytes written over the source before
it is copied (8 bits/byte to any model that does not copy, about 0 to one that does: the gap a cache can
recover is the whole span's, and a copy is easier to learn than on text, where one previous byte matches dozens
of earlier places).

``d`` is one of ``distances`` (training rows draw one uniformly; evaluation row ``i`` takes
``distances[i % len(distances)]``), ``p`` is uniform over the starts that keep the copy inside the window.
``input = S[:T]`` and ``target = S[1:]``, as language modelling. Beyond ``d`` bytes of context a model can
predict the copy only from what it keeps of the source: with a distance of at least ``4L`` a dense window of
``2L`` cannot see it, and a cache that keeps the source can.

Scored bytes: the copied bytes after the first (nothing announces where a copy starts), ``span - 1`` targets
per row. The evaluation sets score only those (``val/bpb`` is bits/byte on the repeated bytes; targets are
:data:`~tvq_exp.batch.IGNORE_INDEX` elsewhere); training scores every byte (``train_targets="all"``, language
modelling on the whole window) or only the repeated ones (``"repeats"``). ``bucket`` is the distance's index
at the scored bytes (``-1`` elsewhere), named ``"dist_<d>"``: next-byte accuracy per distance is
``val/acc_bucket/dist_<d>``. Rows are independent sequences (``reset`` every batch). It is a task of
:class:`~tvq_exp.data.synthetic.base.SyntheticDataModule` (``conf/data/repeat.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import numpy as np

from tvq_exp.data.synthetic.base import Examples, draw_cells
from tvq_exp.data.synthetic.passkey import BYTE_VOCAB_SIZE, BookTask
from tvq_exp.options import AtLeast, OneOf, OptionError, checked


def repeat_text(text: np.ndarray, start: int, distance: int, span: int) -> np.ndarray:
    """A copy of ``text`` (1-D uint8) whose bytes ``start + distance ..`` repeat ``span`` bytes from ``start``."""
    out = text.copy()
    out[start + distance : start + distance + span] = text[start : start + span]
    return out


def scored_targets(start: int, distance: int, span: int) -> slice:
    """Target positions of the copied bytes after the first: ``target[t] = S[t + 1]``, so copied byte
    ``S[start + distance + j]`` (``1 <= j < span``) is target ``start + distance + j - 1``."""
    return slice(start + distance, start + distance + span - 1)


class RepeatTask(BookTask):
    """Gutenberg windows with a passage repeated at a known distance (module docstring for the layout), a task of
    :class:`~tvq_exp.data.synthetic.base.SyntheticDataModule`.

    Options: ``distances`` (distinct, each at least ``span``; a copy needs ``distance + span <= T + 1``),
    ``span`` (bytes repeated, at least 2), ``span_content`` (``"text"``: the book's bytes; ``"random"``: uniform
    random bytes), ``train_targets`` (``"all"``: language modelling on every byte;
    ``"repeats"``: the scored bytes only), ``seq_len`` (``T``), ``corpus_path`` (the Gutenberg folder under the
    data root), ``root`` (the data root; ``None``: ``$TVQ_DATA_DIR``, else ``./data``). Examples: ``(N, T)``.
    """

    eval_examples = None  # the data module's num_val_examples / num_test_examples

    @checked
    def __init__(
        self,
        distances: Sequence[int] = (512, 1024),
        span: Annotated[int, AtLeast(2)] = 256,
        train_targets: Annotated[str, OneOf("all", "repeats")] = "all",
        span_content: Annotated[str, OneOf("text", "random")] = "text",
        seq_len: Annotated[int, AtLeast(2)] = 2048,
        corpus_path: str = "text/gutenberg",
        vocab_size: Annotated[int, OneOf(BYTE_VOCAB_SIZE)] = BYTE_VOCAB_SIZE,
        root: str | None = None,
    ) -> None:
        super().__init__(corpus_path, root)
        self.distances = tuple(int(d) for d in distances)
        self.span, self.train_targets, self.span_content = span, train_targets, span_content
        if not self.distances or len(set(self.distances)) != len(self.distances):
            raise OptionError("distances", list(self.distances), "must be distinct and not empty", type(self))
        bad = [d for d in self.distances if d < span or d + span > seq_len + 1]
        if bad:
            raise OptionError(
                "distances", list(self.distances),
                f"each must be >= span={span} and <= seq_len + 1 - span = {seq_len + 1 - span} ({bad} are not)",
                type(self),
            )  # fmt: skip
        self.seq_len, self.vocab_size = seq_len, vocab_size

    def bucket_names(self, split: str) -> list[str]:
        return [f"dist_{d}" for d in self.distances]

    def generate(self, rng: np.random.Generator, num_examples: int, split: str) -> Examples:
        which = draw_cells(rng, num_examples, len(self.distances), split)
        examples = Examples.empty(num_examples, self.seq_len)
        score_all = split == "train" and self.train_targets == "all"
        for row, index in enumerate(which.tolist()):
            distance = self.distances[index]
            text = np.frombuffer(self.pool(split).window(rng, self.seq_len + 1), dtype=np.uint8)
            start = int(rng.integers(self.seq_len + 2 - distance - self.span))
            if self.span_content == "random":
                text = text.copy()
                text[start : start + self.span] = rng.integers(0, BYTE_VOCAB_SIZE, self.span, dtype=np.uint8)
            text = repeat_text(text, start, distance, self.span)
            scored = scored_targets(start, distance, self.span)
            examples.input[row] = text[:-1]
            if score_all:
                examples.target[row] = text[1:]
            else:
                examples.target[row, scored] = text[1:][scored]
            examples.bucket[row, scored] = index
        return examples


__all__ = ["RepeatTask", "repeat_text", "scored_targets"]
