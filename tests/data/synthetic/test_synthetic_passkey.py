"""Passkey retrieval on the shared Gutenberg books: needle depth, answer, padding, splits, options."""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

import numpy as np
import pytest

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data.synthetic import PasskeyTask, SyntheticDataModule
from tvq_exp.data.synthetic.base import Examples
from tvq_exp.data.synthetic.passkey import QUESTION, needle

LENGTHS = (160, 256, 512)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def module() -> SyntheticDataModule:
    task = functools.partial(
        PasskeyTask, lengths=LENGTHS, depths=DEPTHS, key_digits=6, eval_examples_per_cell=2
    )
    return SyntheticDataModule(task)


def check_example(row: int, examples: Examples, cell: int, seq_len: int = 512, digits: int = 6) -> None:
    """Every invariant of one example of ``cell``."""
    length, depth = LENGTHS[cell // len(DEPTHS)], DEPTHS[cell % len(DEPTHS)]
    inputs, target, bucket = examples.input[row], examples.target[row], examples.bucket[row]
    pad = seq_len - length
    assert (inputs[:pad] == 0).all() and (inputs[pad:] != 0).all()
    answer = target != IGNORE_INDEX
    assert np.flatnonzero(answer).tolist() == list(range(seq_len - digits, seq_len))
    assert (bucket[answer] == cell).all() and (bucket[~answer] == -1).all()

    key = bytes(target[answer].astype(np.uint8)).decode()
    assert key.isdigit() and len(key) == digits and key[0] != "0"
    text = bytes(inputs[pad:].astype(np.uint8))
    assert text.endswith(QUESTION.encode() + key[:-1].encode())
    at = text.find(needle(key))
    assert at >= 0 and text.count(b"pass key") == 4  # twice in the needle, twice in the question
    filler = text[:at] + text[at + len(needle(key)) : length - len(QUESTION) - (digits - 1)]
    exact = depth * len(filler)
    between = filler[min(at, int(exact)) : max(at, int(np.ceil(exact)))]
    assert between.count(b"\n") <= 1, f"needle at {at}, depth {depth} of {len(filler)} bytes"


def test_evaluation_examples(module: SyntheticDataModule) -> None:
    examples = module.eval_examples("validation")
    cells = len(LENGTHS) * len(DEPTHS)
    assert len(examples) == 2 * cells
    for row in range(len(examples)):
        check_example(row, examples, row % cells)


def test_training_examples(module: SyntheticDataModule) -> None:
    examples = module.generate(np.random.default_rng(3), 40, "train")
    cells = examples.bucket[:, -1]
    assert len(set(cells.tolist())) > 5
    for row, cell in enumerate(cells.tolist()):
        check_example(row, examples, cell)


def test_depths_place_the_needle_in_order(module: SyntheticDataModule) -> None:
    """At one length, the needle moves from the start to the end of the passage as the depth grows."""
    examples = module.eval_examples("test")
    long = [row for row in range(len(examples)) if examples.bucket[row, -1] // len(DEPTHS) == 2][
        : len(DEPTHS)
    ]
    starts = [bytes(examples.input[row].astype(np.uint8)).find(b"The pass key is") for row in long]
    assert starts[0] == 1 and starts == sorted(starts) and starts[-1] > 400


def test_splits_read_their_own_books(module: SyntheticDataModule, data_dir: Path) -> None:
    with open(data_dir / "text/gutenberg/CATALOG.tsv", newline="", encoding="utf-8") as handle:
        catalog = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    for split in ("train", "validation", "test"):
        names = {path.name for path in module.task.pool(split).paths}
        assert names == {row["file"] for row in catalog if row["split"] == split}


def test_bucket_names(module: SyntheticDataModule) -> None:
    names = module.bucket_names("test")
    assert len(names) == 15 and names[0] == "len_160_depth_0.00" and names[7] == "len_256_depth_0.50"


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"lengths": [128, 128]}, "lengths=[128, 128]"),
        ({"lengths": [100]}, "lengths=[100]"),
        ({"depths": [0.5, 1.5]}, "depths=[0.5, 1.5]"),
        ({"depths": [0.5, 0.501]}, "depths=[0.5, 0.501]"),
        ({"lengths": [256], "seq_len": 128}, "seq_len=128"),
        ({"key_digits": 0}, "key_digits=0"),
        ({"vocab_size": 300}, "vocab_size=300"),
    ],
)
def test_bad_options_name_option_and_value(options: dict[str, object], option: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"PasskeyTask: {option}: must")):
        PasskeyTask(**options)
