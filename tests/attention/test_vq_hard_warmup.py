"""The soft-to-hard schedule of the keys the attention reads (``codebook.hard_warmup``, issue 43): in training the
window reads ``α·C_z + (1 - α)·k`` with ``α = steps / hard_warmup`` (capped at 1), with the mean-key cache.

The VQ invariants while the schedule lasts: equal to the plain dense reference (``naive.vq_attention``, whose window
reads the quantiser's keys), forward and every gradient; streaming and decoding equal to one shot; causal; at the
schedule's end (and in evaluation) the layer is the mean-key layer with hard codes."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tests.attention.test_vq_cache_reads import assert_equals_the_plain_reference

DK, DV = 6, 5
WARM = {"cache_keys": "mean", "codebook": {"hard_warmup": 4}}


def make(steps: int, window_bias: bool = True, **opts):  # noqa: ANN001, ANN201
    """A training-mode ``VQAttention`` (L = 3, S = 3) at optimiser step ``steps`` of a 4-step warm-up."""
    opts = dict(d_k=DK, d_v=DV, heads=2, codebook_size=3, block_len=3) | WARM | opts
    attn = build("vq", window_bias=window_bias, **opts).double().train()
    if window_bias:
        torch.nn.init.normal_(attn.bias.u)
        torch.nn.init.normal_(attn.bias.v)
    attn.quantizer.steps.fill_(steps)
    return attn


def qkv(t: int, h_kv: int = 2, b: int = 2):  # noqa: ANN201
    mk = lambda h, d: torch.randn(b, h, t, d, dtype=torch.float64, requires_grad=True)
    return mk(2, DK), mk(h_kv, DK), mk(h_kv, DV)


@pytest.mark.parametrize("steps", [0, 1, 3])
@pytest.mark.parametrize("t,kv_heads", [(12, None), (13, 1), (8, None)])
def test_equals_the_plain_reference_forward_and_gradients_fp64(
    steps: int, t: int, kv_heads: int | None
) -> None:
    torch.manual_seed(0)
    attn = make(steps, kv_heads=kv_heads)
    q, k, v = qkv(t, h_kv=kv_heads or 2)
    out = assert_equals_the_plain_reference(attn, q, k, v)[0]
    with torch.no_grad():
        hard = attn.eval()(q, k, v)[0]  # evaluation reads the codes
    assert (out - hard).abs().max() > 1e-6


def test_the_window_reads_the_blend_by_hand() -> None:
    """The last query of a 2-block sequence (no cache read yet, one head, no bias) at α = 1/4: softmax over the
    keys ``C_z/4 + 3k/4`` of its window."""
    torch.manual_seed(1)
    attn = make(1, window_bias=False, heads=1)
    q, k, v = (x.detach()[:1, :1] for x in qkv(6, h_kv=1))
    out = attn(q, k, v)[0][0, 0, -1]
    with torch.no_grad():
        codes = attn.quantizer.eval()(k)[1][0, 0]
        keys = attn.quantizer.codebook[0, codes] / 4 + 3 * k[0, 0] / 4
        want = torch.softmax(q[0, 0, -1] @ keys.T, 0) @ v[0, 0]
    assert torch.allclose(out, want, atol=1e-12)


@pytest.mark.parametrize("steps", [1, 4])
def test_streams_and_decodes_as_one_shot(steps: int) -> None:
    torch.manual_seed(2)
    attn = make(steps)
    q, k, v = (x.detach() for x in qkv(16))
    whole = attn(q, k, v)[0]
    pieces, state, start = [], None, 0
    for end in (7, 8, 13, 16):
        out, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        pieces.append(out)
        start = end
    assert torch.allclose(torch.cat(pieces, 2), whole, atol=1e-12)
    steps_out, state = [], None
    for t in range(16):
        out, state, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        steps_out.append(out)
    assert torch.allclose(torch.cat(steps_out, 2), whole, atol=1e-12)


def test_causal_by_jacobian() -> None:
    torch.manual_seed(3)
    attn = make(2)
    q, k, v = (x.detach()[:1] for x in qkv(10))

    def f(x: torch.Tensor) -> torch.Tensor:
        return attn(x[..., :DK], x[..., DK : 2 * DK], x[..., 2 * DK :], None)[0]

    jac = torch.autograd.functional.jacobian(f, torch.cat([q, k, v], -1))
    assert torch.all(jac.abs().sum(dim=(0, 1, 3, 4, 5, 7)).triu(1) == 0)


def test_at_the_end_of_the_warm_up_training_reads_the_codes() -> None:
    torch.manual_seed(4)
    attn = make(4)
    q, k, v = (x.detach() for x in qkv(12))
    with torch.no_grad():
        trained = attn(q, k, v)[0]
        evaluated = attn.eval()(q, k, v)[0]
    assert torch.equal(trained, evaluated)


@pytest.mark.parametrize("opts", [{"cache_keys": "code"}, {"cache_keys": "code", "window_len": 2}])
def test_refused_with_the_official_cache(opts: dict) -> None:
    with pytest.raises(ValueError, match="hard_warmup"):
        build("vq", d_k=4, d_v=4, codebook_size=8, block_len=4, codebook={"hard_warmup": 10}, **opts)


def test_allowed_without_the_cache() -> None:
    attn = build(
        "vq", d_k=4, d_v=4, codebook_size=8, block_len=4, use_cache=False, codebook={"hard_warmup": 10}
    )
    assert attn.quantizer.hard_warmup == 10
