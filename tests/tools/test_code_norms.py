"""``tools/cache_diagnosis/code_norms.py``: the usage-weighted norm of the codes a trained VQ model's scores read,
against a hand computation, and the key norm it compares them with."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from tests.helpers.paths import REPO
from tvq_exp.attention import build_attention

_spec = importlib.util.spec_from_file_location(
    "code_norms", REPO / "tools" / "cache_diagnosis" / "code_norms.py"
)
code_norms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_norms)


def vq_layer(normalize: bool) -> nn.Module:
    """One VQ layer whose two codes read out as ``(3, 4)`` (used once) and ``(0, 1)`` (used three times)."""
    layer = build_attention(
        "vq", d_k=2, d_v=2, heads=1, codebook_size=2, block_len=4, codebook={"normalize": normalize}
    )
    layer.quantizer.ema_count.copy_(torch.tensor([[1.0, 3.0]]))
    layer.quantizer.embed.copy_(torch.tensor([[[3.0, 4.0], [0.0, 1.0]]]))  # the EMA rule's read-out
    return layer


@pytest.mark.parametrize(("normalize", "expected"), [(False, (5.0 * 1 + 1.0 * 3) / 4), (True, 1.0)])
def test_code_norm_is_the_usage_weighted_mean(normalize: bool, expected: float) -> None:
    model = nn.Sequential(vq_layer(normalize), nn.Linear(2, 2), vq_layer(False))
    assert code_norms.code_norms(model) == pytest.approx([expected, 2.0])


@pytest.mark.parametrize(
    ("block", "codebook", "expected"),
    [
        ({"d_k": 64}, {}, 64**0.25),
        ({"d_k": 64, "key_norm": "unit"}, {}, 1.0),
        ({"d_k": 64, "key_norm": "rms"}, {"normalize": True}, 1.0),
    ],
)
def test_key_norm_follows_the_block_and_the_codebook(block: dict, codebook: dict, expected: float) -> None:
    config = {"model": {"block": block, "attention": {"codebook": codebook}}}
    assert code_norms.key_norm(config) == pytest.approx(expected)
