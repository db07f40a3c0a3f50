"""``tools/cache_diagnosis/copy_codes.py``: reading the cached keys of the source key's code, by hand, and the codes
it takes from a VQ decoder (the quantiser's nearest codes of every layer's keys)."""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.paths import REPO
from tvq_exp.attention import build_attention
from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder
from tvq_exp.quantize.kmeans import nearest_code

_spec = importlib.util.spec_from_file_location(
    "copy_codes", REPO / "tools" / "cache_diagnosis" / "copy_codes.py"
)
copy_codes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(copy_codes)

#              0  1  2  3  4  5  6  7  8  9 10 11
X = np.array([[5, 7, 9, 5, 8, 5, 7, 1, 5, 7, 2, 3]])
CODES = np.array([[0, 1, 2, 0, 1, 2, 1, 0, 1, 1, 1, 1]])


def one_target(t: int, value: int) -> tuple[np.ndarray, np.ndarray]:
    targets, buckets = np.full_like(X, IGNORE_INDEX), np.full_like(X, -1)
    targets[0, t], buckets[0, t] = value, 0
    return targets, buckets


def test_the_source_code_is_read_from_the_cache_by_hand() -> None:
    """L = 2, distance 6: target 11 copies from key 6 (code 1); the cache is positions 0..7, where code 1 holds
    keys 1, 4 and 6 with bytes 7, 8 and 7 (keys 8.. are in the exact window, not the cache)."""
    targets, buckets = one_target(11, 7)
    n, acc, bits, shared = copy_codes.source_code_reads(X, targets, buckets, CODES, [6], block_len=2)
    eps = copy_codes.oracle_bits.__defaults__[0]
    assert (n, acc, shared) == (1, 1.0, 3.0)
    assert bits == pytest.approx(-math.log2((1 - eps) * 2 / 3 + eps / 256))
    targets, buckets = one_target(11, 8)  # the other byte of the code: the counts' third, not the argmax
    assert copy_codes.source_code_reads(X, targets, buckets, CODES, [6], block_len=2)[1] == 0.0


def test_a_source_inside_the_exact_window_is_refused() -> None:
    targets, buckets = one_target(11, 7)
    with pytest.raises(ValueError, match="source 8 of target 11 is not in the cache"):
        copy_codes.source_code_reads(X, targets, buckets, CODES, [4], block_len=2)


def test_vq_codes_are_the_nearest_codes_of_every_layers_keys() -> None:
    torch.manual_seed(0)
    attention = functools.partial(build_attention, "vq", codebook_size=8, block_len=4)
    model = Decoder(256, 32, 2, functools.partial(GAUBlock, d_k=16), attention)
    keys: dict[int, torch.Tensor] = {}

    def keep_keys(layer: int) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            keys[layer] = args[1].detach()  # (B, H, T, d): the attention's k

        return hook

    for i, block in enumerate(model.blocks):
        block.attn.register_forward_pre_hook(keep_keys(i))
    inputs = torch.randint(0, 256, (3, 12))
    codes = copy_codes.vq_codes(model, inputs)
    assert sorted(codes) == [0, 1]
    for layer, got in codes.items():
        assert got.shape == (3, 1, 12)
        codebook = model.blocks[layer].attn.quantizer.codebook.detach()
        k = keys[layer].transpose(0, 1).flatten(1, 2)  # (H, B*T, d)
        expected = nearest_code(k, codebook).view(1, 3, 12).transpose(0, 1)
        assert np.array_equal(got, expected.numpy())


def test_conditional_entropy_by_hand() -> None:
    codes = np.array([0, 0, 1, 1])
    assert copy_codes.conditional_entropy(np.array([4, 4, 5, 5]), codes) == pytest.approx(
        0.0
    )  # the code names it
    assert copy_codes.conditional_entropy(np.array([4, 5, 4, 5]), codes) == pytest.approx(
        1.0
    )  # a coin per code
    assert copy_codes.conditional_entropy(np.array([4, 5, 6, 6]), codes) == pytest.approx(0.5)
