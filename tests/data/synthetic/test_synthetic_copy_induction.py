"""Selective copying (Mamba) and induction heads (H3): answers, buckets, options."""

from __future__ import annotations

import numpy as np
import pytest

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data.synthetic import InductionTask, SelectiveCopyTask


def test_selective_copy_outputs_data_tokens_in_order() -> None:
    module = SelectiveCopyTask(seq_len=200, num_tokens_to_copy=16, vocab_size=16)
    ex = module.generate(np.random.default_rng(0), 64, "train")
    prefix = 200 - 16
    answer = ex.target != IGNORE_INDEX
    assert (answer.sum(1) == 16).all() and answer[:, prefix:].all()
    assert (ex.input[:, prefix:] == 15).all()
    for row in range(len(ex)):
        positions = np.flatnonzero(ex.input[row, :prefix])
        assert len(positions) == 16
        data = ex.input[row, positions]
        assert data.min() >= 1 and data.max() <= 14
        assert ex.target[row, prefix:].tolist() == data.tolist()
        distance = prefix + np.arange(16) - positions
        assert (
            ex.bucket[row, prefix:].tolist()
            == (np.searchsorted([0, 32, 64, 128, 256], distance, "right") - 1).tolist()
        )
    assert module.bucket_names("test") == ["gap_0_32", "gap_32_64", "gap_64_128", "gap_128_256"]
    assert len(np.unique(ex.input[:, :prefix])) == 15  # noise and every data token, never the marker


def test_selective_copy_positions_are_uniform() -> None:
    module = SelectiveCopyTask(seq_len=40, num_tokens_to_copy=4, vocab_size=8)
    ex = module.generate(np.random.default_rng(1), 20_000, "train")
    counts = (ex.input[:, :36] != 0).sum(0)
    assert abs(counts / counts.mean() - 1).max() < 0.1


def test_induction_target_is_the_token_after_the_first_trigger() -> None:
    module = InductionTask(seq_len=256, vocab_size=16)
    ex = module.generate(np.random.default_rng(0), 512, "train")
    answer = ex.target != IGNORE_INDEX
    assert answer[:, -1].all() and answer.sum() == 512
    assert (ex.input[:, -1] == 15).all() and ((ex.input == 15).sum(1) == 2).all()
    first = np.argmax(ex.input == 15, axis=1)
    assert first.max() <= 256 - 4
    assert (ex.target[:, -1] == ex.input[np.arange(512), first + 1]).all()
    assert (ex.bucket[:, -1] == np.searchsorted([0, 32, 64, 128, 256], 255 - first, "right") - 1).all()
    assert (ex.bucket[~answer] == -1).all()
    assert ex.input[:, :-1][ex.input[:, :-1] != 15].max() == 14


@pytest.mark.parametrize(
    ("cls", "options", "option"),
    [
        (SelectiveCopyTask, {"seq_len": 30, "num_tokens_to_copy": 16}, "num_tokens_to_copy=16"),
        (SelectiveCopyTask, {"vocab_size": 2}, "vocab_size=2"),
        (InductionTask, {"seq_len": 3}, "seq_len=3"),
        (InductionTask, {"vocab_size": 1}, "vocab_size=1"),
        (InductionTask, {"first_gap": 0}, "first_gap=0"),
    ],
)
def test_bad_options_name_option_and_value(cls: type, options: dict[str, object], option: str) -> None:
    with pytest.raises(ValueError, match=f"{cls.__name__}: {option}: must"):
        cls(**options)
