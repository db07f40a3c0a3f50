"""The repeat probe: a copy at the stated distance, the scored bytes and their buckets, the Gutenberg split."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data.synthetic.base import Examples, SyntheticDataModule
from tvq_exp.data.text.repeat import RepeatTask, repeat_text, scored_targets

T, DISTANCES, SPAN = 512, (128, 300), 64


def repeat_module(**task: object) -> SyntheticDataModule:
    options = {"distances": DISTANCES, "span": SPAN} | task
    return SyntheticDataModule(
        task=functools.partial(RepeatTask, **options), seq_len=T, num_val_examples=6, num_test_examples=4
    )


@pytest.fixture(scope="module")
def module() -> SyntheticDataModule:
    return repeat_module()


def copy_start(bucket: np.ndarray) -> int:
    """Position of the first copied byte (``p + d``): the first scored target."""
    return int(np.flatnonzero(bucket >= 0)[0])


def check_row(examples: Examples, row: int, all_targets: bool) -> None:
    inputs, target, bucket = examples.input[row], examples.target[row], examples.bucket[row]
    scored = np.flatnonzero(bucket >= 0)
    index = int(bucket[scored[0]])
    d = DISTANCES[index]
    start = copy_start(bucket)  # p + d
    assert scored.tolist() == list(range(start, start + SPAN - 1))  # the copied bytes after the first
    assert (bucket[scored] == index).all()
    assert start - d >= 0 and start + SPAN - 1 <= T
    text = np.append(inputs, target[-1])  # S: its last byte is known wherever the copy reaches it
    assert (text[start : start + SPAN] == text[start - d : start - d + SPAN]).all()  # a copy at distance d
    assert (target[scored] == text[scored + 1]).all()
    assert (target[scored] == text[scored + 1 - d]).all()
    if all_targets:
        assert (target[:-1] == inputs[1:]).all()  # language modelling on every byte
    else:
        assert (target[bucket < 0] == IGNORE_INDEX).all()


def test_evaluation_rows_score_only_the_copy_and_cycle_through_the_distances(
    module: SyntheticDataModule,
) -> None:
    examples = module.eval_examples("validation")
    assert len(examples) == 6 and module.bucket_names("validation") == ["dist_128", "dist_300"]
    for row in range(len(examples)):
        check_row(examples, row, all_targets=False)
        assert examples.bucket[row].max() == row % 2
    assert ((examples.target != IGNORE_INDEX).sum(1) == SPAN - 1).all()


@pytest.mark.parametrize("train_targets", ["all", "repeats"])
def test_training_rows(train_targets: str) -> None:
    module = repeat_module(train_targets=train_targets)
    examples = module.generate(np.random.default_rng(5), 12, "train")
    for row in range(len(examples)):
        check_row(examples, row, all_targets=train_targets == "all")
    assert set(examples.bucket.max(1).tolist()) == {0, 1}


def test_random_spans_are_uniform_bytes_copied_into_the_same_text() -> None:
    random_module = repeat_module(span_content="random")
    examples = random_module.generate(np.random.default_rng(5), 12, "train")
    spans = []
    for row in range(len(examples)):
        check_row(examples, row, all_targets=True)  # still a copy at the row's distance
        start = copy_start(examples.bucket[row])
        spans.append(examples.input[row, start : start + SPAN])
    # 768 uniform bytes take about 243 of the 256 values; English text takes a few dozen
    assert len(np.unique(np.concatenate(spans))) > 200
    # the same draw in "text" mode gives the same window and positions for the first row: only the span differs
    text_mode = repeat_module().generate(np.random.default_rng(5), 12, "train")
    start = copy_start(examples.bucket[0])
    d = DISTANCES[int(examples.bucket[0, start])]
    outside = np.ones(T, dtype=bool)
    outside[start - d : start - d + SPAN] = outside[start : start + SPAN] = False
    assert (examples.input[0][outside] == text_mode.input[0][outside]).all()
    assert (examples.input[0][~outside] != text_mode.input[0][~outside]).mean() > 0.9


def test_repeat_text_and_scored_targets_by_hand() -> None:
    text = np.arange(20, dtype=np.uint8)
    out = repeat_text(text, start=2, distance=8, span=3)
    assert out.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, *range(13, 20)]
    assert text[10] == 10  # the source text is left unchanged
    assert scored_targets(2, 8, 3) == slice(10, 12)  # targets 10, 11 are bytes 11, 12 of the copy: 3, 4


def test_each_split_reads_its_own_books_and_the_evaluation_sets_are_fixed(
    module: SyntheticDataModule,
) -> None:
    books = {
        split: [bytes(book) for book in module.task.pool(split).books]
        for split in ("train", "validation", "test")
    }
    for split in ("validation", "test"):
        examples = module.eval_examples(split)
        for row in range(2):
            source_end = copy_start(examples.bucket[row])  # bytes before the copy are the book's own
            prefix = bytes(examples.input[row, :source_end].astype(np.uint8))
            found = {name for name, texts in books.items() if any(prefix in text for text in texts)}
            assert found == {split}
    again = repeat_module()
    assert again.eval_checksums == module.eval_checksums
    assert module.eval_checksums["validation"] != module.eval_checksums["test"]


@pytest.mark.parametrize(
    "bad",
    [
        {"distances": [32]},
        {"distances": [500]},
        {"distances": [128, 128]},
        {"span": 1},
        {"train_targets": "x"},
        {"span_content": "x"},
    ],
)
def test_bad_options_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="|".join(bad)):
        RepeatTask(**({"seq_len": T, "distances": DISTANCES, "span": SPAN} | bad))
