"""Smeared keys (``key_smear``): the attention sees ``σ(a)·k_t + (1 - σ(a))·k_{t-1}``, computed by hand here; the
logit learns (its gradient against finite differences); causality by Jacobian with every kind of backend; the
streaming and decoding invariants are in tests/models/test_decoder.py, the config check in tests/run/test_validation.py."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.models.test_blocks import input_dependence
from tvq_exp.attention import build_attention
from tvq_exp.models.blocks import GAUBlock, MHABlock

BACKENDS = {
    "dense": {"name": "dense", "window_len": 4},
    "vq": {"name": "vq", "codebook_size": 8, "block_len": 4},
    "linear": {"name": "linear", "chunk_size": 4},
}


def block(kind: str, backend: str, smear: bool) -> torch.nn.Module:
    """A small fp64 block (its weights do not depend on ``smear``: the logit draws no random numbers)."""
    attn = functools.partial(build_attention, **BACKENDS[backend])
    position = "rope" if backend == "linear" else "xl"
    torch.manual_seed(0)
    if kind == "gau":
        blk = GAUBlock(d_model=16, attention=attn, d_k=6, heads=2, position=position, key_smear=smear)
    else:
        blk = MHABlock(
            d_model=16, attention=attn, heads=4, key_size=6, kv_heads=2, position=position, key_smear=smear
        )
    return blk.double().eval()


def keys_seen(blk: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The keys ``(B, H_kv, T, d_k)`` the block hands its attention (before RoPE, which the linear backends'
    blocks apply after smearing: compared on the XL blocks only)."""
    seen: list[torch.Tensor] = []
    handle = blk.attn.register_forward_hook(lambda m, args, out: seen.append(args[1]))
    blk(x)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("kind", ["gau", "mha"])
def test_smeared_keys_equal_the_hand_computed_mix(kind: str) -> None:
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    plain = keys_seen(block(kind, "dense", smear=False), x)
    smeared_block = block(kind, "dense", smear=True)
    logits = torch.tensor([0.7, -1.3], dtype=torch.float64)
    smeared_block.smear_logit.data.copy_(logits)
    got = keys_seen(smeared_block, x)
    expected = torch.empty_like(plain)
    for h, a in enumerate(logits.tolist()):
        w = 1 / (1 + torch.exp(torch.tensor(-a, dtype=torch.float64)))
        for t in range(plain.shape[2]):
            before = plain[:, h, t - 1] if t > 0 else torch.zeros_like(plain[:, h, 0])
            expected[:, h, t] = w * plain[:, h, t] + (1 - w) * before
    assert got.shape == plain.shape == (2, 2, 9, 6)
    assert torch.allclose(got, expected, atol=1e-12)


def test_smear_logit_gradient_matches_finite_differences() -> None:
    blk = block("gau", "dense", smear=True)
    x = torch.randn(1, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    direction = torch.randn(1, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def loss(logit: torch.Tensor) -> torch.Tensor:
        blk.smear_logit.data.copy_(logit)
        return (blk(x)[0] * direction).sum()

    logit = torch.tensor([0.2, -0.4], dtype=torch.float64)
    blk.smear_logit.grad = None
    loss(logit).backward()
    grad = blk.smear_logit.grad.clone()
    eps = 1e-6
    for h in range(2):
        step = torch.zeros(2, dtype=torch.float64)
        step[h] = eps
        with torch.no_grad():
            numeric = (loss(logit + step) - loss(logit - step)) / (2 * eps)
        assert torch.allclose(grad[h], numeric, rtol=1e-6, atol=1e-9)
    assert grad.abs().min() > 0


@pytest.mark.parametrize("kind", ["gau", "mha"])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_smeared_keys_stay_causal(kind: str, backend: str) -> None:
    """``d out_t / d x_s`` is zero for every ``s > t``, and the smear makes ``out_t`` depend on ``x_{t-1}``
    through the key as well (nonzero below the diagonal)."""
    dep = input_dependence(block(kind, backend, smear=True), 11)
    assert dep.triu(1).max() == 0
    assert (dep.diagonal(-1) > 0).all()
