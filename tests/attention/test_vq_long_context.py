"""Transformer-VQ over very long contexts: the compressive cache's counts stay exact integers."""

from __future__ import annotations

import torch

from tests.attention.backends import build


def test_cache_counts_stay_exact_beyond_fp32_integers() -> None:
    """fp32 holds every integer only below 2^24 (16.7M tokens, less than a PG-19 book set or the enwik8 test
    split carried whole); the cache keeps float64 counts, so one more token still counts."""
    attn = build("vq", d_k=4, d_v=3, heads=1, codebook_size=2, block_len=2, window_bias=False)
    k = torch.ones(1, 1, 6, 4)  # every key lands on one code
    _, state, _ = attn(torch.randn(1, 1, 6, 4), k, torch.randn(1, 1, 6, 3))
    code = int(state.cache_n[0, 0].argmax())
    big = float(2**24 + 1)  # not representable in fp32
    state.cache_n[0, 0, code] = big
    _, after, _ = attn(torch.randn(1, 1, 2, 4), torch.ones(1, 1, 2, 4), torch.randn(1, 1, 2, 3), state)
    assert float(after.cache_n[0, 0, code]) == big + 2  # the two keys of the block that left the window
    assert after.cache_n.dtype == torch.float64
