"""BucketAccuracy: only answer positions count, per bucket and per sequence, summed across processes."""

from __future__ import annotations

import math

import pytest
import torch

from tvq_exp.models.metrics import BucketAccuracy

X = -100  # no answer here
# 3 rows, 6 positions, 3 buckets. Predictions at ignored positions are wrong on purpose: they must not count.
TARGET = torch.tensor([[X, 5, X, 7, X, 9], [X, X, 1, 2, 3, X], [X, X, X, X, X, X]])
PREDS = torch.tensor([[0, 5, 0, 6, 0, 9], [0, 0, 1, 2, 3, 0], [4, 4, 4, 4, 4, 4]])
BUCKET = torch.tensor([[-1, 0, -1, 1, -1, 1], [-1, -1, 0, 0, 2, -1], [-1, -1, -1, -1, -1, -1]])
NATS = torch.arange(18, dtype=torch.float32).view(3, 6) / 10  # position (r, c) costs (6r + c) / 10 nats


def close(actual: torch.Tensor, expected: list[float]) -> bool:
    return all(
        (math.isnan(e) and math.isnan(a)) or abs(a - e) < 1e-12
        for a, e in zip(actual.tolist(), expected, strict=True)
    )


def test_hand_computed() -> None:
    metric = BucketAccuracy(num_buckets=4)
    metric.update(PREDS, TARGET, BUCKET, NATS)
    result = metric.compute()
    # answers: bucket 0 -> 5 ok, 1 ok, 2 ok; bucket 1 -> 7 wrong, 9 ok; bucket 2 -> 3 ok; bucket 3 empty
    assert result["accuracy"].item() == pytest.approx(5 / 6)
    assert close(result["bucket_accuracy"], [1.0, 0.5, 1.0, math.nan])
    assert result["bucket_count"].tolist() == [3, 2, 1, 0]
    # row 0 has a wrong answer, row 1 is all right, row 2 has no answers and is not counted
    assert result["sequence_accuracy"].item() == pytest.approx(1 / 2)
    # (row, bucket) groups: (0,0) ok, (0,1) wrong, (1,0) ok, (1,2) ok
    assert close(result["bucket_sequence_accuracy"], [1.0, 0.0, 1.0, math.nan])
    assert result["accuracy"].dtype == torch.float64


def test_bits_per_answer_bucket() -> None:
    """With the loss given, bits per answer token per bucket: the nats at answer positions only, / ln 2."""
    metric = BucketAccuracy(num_buckets=4)
    metric.update(PREDS, TARGET, BUCKET, NATS)
    # bucket 0: (0,1) (1,2) (1,3) -> 0.1 + 0.8 + 0.9; bucket 1: (0,3) (0,5) -> 0.3 + 0.5; bucket 2: (1,4) -> 1.0
    expected = [1.8 / 3 / math.log(2), 0.8 / 2 / math.log(2), 1.0 / math.log(2), math.nan]
    assert all(
        (math.isnan(e) and math.isnan(a)) or abs(a - e) < 1e-6
        for a, e in zip(metric.compute()["bucket_bpb"].tolist(), expected, strict=True)
    )


def test_accumulates_and_merges_like_ddp() -> None:
    whole = BucketAccuracy(num_buckets=3)
    whole.update(PREDS, TARGET, BUCKET, NATS)
    whole.update(PREDS[:2].flip(1), TARGET[:2].flip(1), BUCKET[:2].flip(1), NATS[:2].flip(1))
    first, second = BucketAccuracy(num_buckets=3), BucketAccuracy(num_buckets=3)
    first.update(PREDS, TARGET, BUCKET, NATS)
    second.update(PREDS[:2].flip(1), TARGET[:2].flip(1), BUCKET[:2].flip(1), NATS[:2].flip(1))
    first.merge_state(second)  # the same sum DDP's dist_reduce_fx="sum" does
    for key, value in whole.compute().items():
        assert torch.equal(value.nan_to_num(-1), first.compute()[key].nan_to_num(-1)), key
    assert whole.compute()["bucket_count"].tolist() == [6, 4, 2]
    assert whole.total.dtype == torch.int64


def test_empty_metric_is_nan() -> None:
    metric = BucketAccuracy(num_buckets=2)
    metric.update(PREDS[2:], TARGET[2:], BUCKET[2:], NATS[2:])
    result = metric.compute()
    assert math.isnan(result["accuracy"].item()) and math.isnan(result["sequence_accuracy"].item())


def test_bad_inputs() -> None:
    metric = BucketAccuracy(num_buckets=2)
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        metric.update(PREDS, TARGET, BUCKET, NATS)  # bucket 2 at an answer
    with pytest.raises(ValueError, match="must all be"):
        metric.update(PREDS[:, :3], TARGET, BUCKET, NATS)
    with pytest.raises(ValueError, match="num_buckets=0"):
        BucketAccuracy(num_buckets=0)
