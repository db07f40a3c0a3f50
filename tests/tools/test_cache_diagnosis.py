"""``tools/cache_diagnosis/cache_mass.py``: the share of the attention that falls on the compressive cache, against
a softmax written out by hand, and the rows it counts."""

from __future__ import annotations

import importlib.util
import math

import torch

from tests.helpers.paths import REPO
from tvq_exp.attention.vq.kernel import CodeCache, WindowIndex, WindowInputs

_spec = importlib.util.spec_from_file_location(
    "cache_mass", REPO / "tools" / "cache_diagnosis" / "cache_mass.py"
)
cache_mass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cache_mass)


def test_the_cache_share_is_the_softmax_weight_on_the_cache_columns() -> None:
    """Two items of one query row each, a window of two keys (block length 1) and a cache of two codes; item 1's
    cache is empty (no row counted)."""
    q = torch.tensor([[[[1.0, 0.0]], [[0.5, 2.0]]]], dtype=torch.float64)  # (N 1, I 2, R 1, d 2)
    kb = torch.tensor(
        [[[[0.2, 1.0]], [[-1.0, 0.3]], [[0.7, 0.7]]]], dtype=torch.float64
    )  # (1, I + 1, L 1, 2)
    vb = torch.randn(1, 3, 1, 3, dtype=torch.float64)
    codebook = torch.tensor([[[1.5, -0.5], [0.0, 1.0]]], dtype=torch.float64)  # (1, S 2, 2)
    log_n = torch.tensor([[[math.log(3.0), math.log(2.0)], [-math.inf, -math.inf]]], dtype=torch.float64)
    mu = torch.randn(1, 2, 2, 3, dtype=torch.float64)
    index = WindowIndex(first=1, rows=1, width=2)  # both window keys visible (distances 1 and 0, no bias)
    inputs = WindowInputs(q, kb, vb, index, None, CodeCache(codebook, log_n, mu), prev_masked=False)

    share = cache_mass.cache_share(inputs, prev_grad=True)

    window = [1.0 * 0.2 + 0.0 * 1.0, 1.0 * -1.0 + 0.0 * 0.3]  # item 0 sees blocks 0 and 1
    cache = [1.0 * 1.5 + math.log(3.0), 0.0 * 1.0 + math.log(2.0)]
    expected = sum(map(math.exp, cache)) / sum(map(math.exp, window + cache))
    assert share.shape == (1, 1)  # item 1 (an empty cache) is not counted
    assert abs(float(share[0, 0]) - expected) < 1e-12


def test_without_a_cache_there_is_no_share() -> None:
    x = torch.zeros(1, 1, 1, 2)
    inputs = WindowInputs(
        x, torch.zeros(1, 2, 1, 2), torch.zeros(1, 2, 1, 2), WindowIndex(first=1, rows=1, width=2)
    )
    assert cache_mass.cache_share(inputs, prev_grad=True) is None
