"""Decoder-level invariants: streaming equals one shot, decoding equals parallel, causality."""

from __future__ import annotations

import functools

import pytest
import torch

from tvq_exp.attention import build_attention
from tvq_exp.models.blocks import GAUBlock, MHABlock
from tvq_exp.models.decoder import Decoder, detach_state

BLOCKS = {
    "gau": functools.partial(GAUBlock, d_k=16, layerdrop=0.1, dropout=0.1),
    "mha": functools.partial(MHABlock, heads=2, key_size=8, kv_heads=1),
    "mha_rope": functools.partial(MHABlock, heads=2, position="rope"),
    "gau_smear": functools.partial(GAUBlock, d_k=16, key_smear=True),
    "mha_rope_smear": functools.partial(
        MHABlock, heads=2, key_size=8, kv_heads=1, position="rope", key_smear=True
    ),
}
ATTENTION = {
    "vq": functools.partial(build_attention, "vq", codebook_size=8, block_len=4),
    "dense": functools.partial(build_attention, "dense", window_len=4),
}


def make(block: str, attention: str) -> Decoder:
    torch.manual_seed(0)
    return Decoder(256, 32, 2, BLOCKS[block], ATTENTION[attention]).double().eval()


@pytest.fixture(params=[(b, a) for b in BLOCKS for a in ATTENTION], ids=lambda p: "-".join(p))
def model(request: pytest.FixtureRequest) -> Decoder:
    """A small decoder of every block with every attention (fp64, eval mode)."""
    return make(*request.param)


def test_segments_and_decoding_equal_one_shot(model: Decoder) -> None:
    x = torch.randint(0, 256, (2, 23))
    full = model(x).logits
    a = model(x[:, :9])
    b = model(x[:, 9:], detach_state(a.state))
    assert torch.allclose(torch.cat([a.logits, b.logits], 1), full, atol=1e-10)
    state, steps = None, []
    for t in range(x.shape[1]):
        out = model(x[:, t : t + 1], state)
        state = out.state
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-10)


def test_changing_token_t_never_changes_earlier_outputs(model: Decoder) -> None:
    x = torch.randint(0, 256, (1, 20))
    base = model(x).logits
    for t in (0, 7, 13, 19):
        y = x.clone()
        y[0, t] = (y[0, t] + 1) % 256
        out = model(y).logits
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t], base[:, t])


def test_aux_collects_layer_losses_and_metrics() -> None:
    model = make("gau", "vq").train()
    out = model(torch.randint(0, 256, (2, 12)))
    commit = sum(out.aux[f"layer{i}/commit_loss"] for i in range(2))
    assert torch.allclose(out.aux["loss"], commit.to(out.aux["loss"].dtype))
    assert out.aux["loss"].requires_grad
    assert {"layer0/perplexity", "layer1/quant_error", "layer1/dead_codes"} <= set(out.aux)
    assert len(model.quantizers()) == 2


def test_tied_head_shares_embedding() -> None:
    model = make("gau", "dense")
    assert model.head.weight is model.embed.weight
