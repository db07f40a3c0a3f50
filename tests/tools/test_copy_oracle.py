"""``tools/cache_diagnosis/copy_oracle.py``: the bound of a compressive cache keyed on the preceding bytes, on
cases worked by hand, and its cache boundary (what the exact window sees is not the cache's)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from tests.helpers.paths import REPO
from tvq_exp.batch import IGNORE_INDEX

_spec = importlib.util.spec_from_file_location(
    "copy_oracle", REPO / "tools" / "cache_diagnosis" / "copy_oracle.py"
)
copy_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(copy_oracle)

#              0  1  2  3  4  5  6  7  8  9
X = np.array([5, 7, 9, 5, 8, 5, 7, 1, 5, 7], dtype=np.int64)


@pytest.mark.parametrize(
    ("t", "context", "cache_end", "expected"),
    [
        (9, 1, 9, [9, 1]),  # after every 7 (x[9]) in the cache: positions 2 and 7
        (9, 1, 5, [9]),  # the cache ends at 5: position 7 is in the exact window, not the cache
        (9, 2, 9, [9, 1]),  # after "5 7" (x[8..9]): positions 2 and 7
        (6, 2, 6, [9]),  # "5 7" (x[5..6]) before position 6: only at 0..1 -> x[2]
        (9, 2, 4, [9]),  # only "5 7" at 0..1 has its next byte (position 2) inside the cache
        (1, 2, 0, []),  # an empty cache
    ],
)
def test_cached_next_bytes_by_hand(t: int, context: int, cache_end: int, expected: list[int]) -> None:
    assert copy_oracle.cached_next_bytes(X, t, context, cache_end).tolist() == expected


def test_a_cache_reaching_the_query_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_end=10 must be <= t=9"):
        copy_oracle.cached_next_bytes(X, 9, 1, 10)


def test_oracle_bits_by_hand() -> None:
    eps = copy_oracle.EPS
    assert copy_oracle.oracle_bits(np.array([3, 3, 4]), 3) == (
        pytest.approx(-math.log2((1 - eps) * 2 / 3 + eps / 256)),
        True,
    )
    assert copy_oracle.oracle_bits(np.array([3, 3, 4]), 4)[1] is False
    assert copy_oracle.oracle_bits(np.array([3, 3, 4]), 9)[0] == pytest.approx(-math.log2(eps / 256))
    assert copy_oracle.oracle_bits(np.array([], dtype=np.int64), 9) == (8.0, False)


def test_score_reads_only_the_cache_of_each_target() -> None:
    """Two rows with L = 2: the target at position 9 (block 4) sees blocks 3 and 4 exactly, the cache is
    positions 0..5; the one at 3 (block 1) has an empty cache."""
    inputs = np.stack([X, X])
    targets = np.full_like(inputs, IGNORE_INDEX)
    buckets = np.full_like(inputs, -1)
    targets[0, 9], buckets[0, 9] = 8, 0  # after x[9] = 7: the cached 7s (positions 1) were followed by 9
    targets[1, 3], buckets[1, 3] = 8, 1
    result = copy_oracle.score(inputs, targets, buckets, block_len=2, context=1)
    # row 0: cache positions 0..5; 7 at position 1 is followed by 9 -> the target 8 gets eps / 256
    assert result[0] == pytest.approx((1, 0.0, -math.log2(copy_oracle.EPS / 256), 0.0))
    # row 1: block 1 sees blocks 0 and 1 exactly, nothing is cached: the uniform 8 bits, no match
    assert result[1] == pytest.approx((1, 0.0, 8.0, 1.0))
