"""Linear attention: equals its token-loop reference, chunk size never matters, streaming and
decoding equal the parallel forward (backend and model level)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from tests.attention.backends import build
from tvq_exp.attention import AttentionBackend, State, build_attention
from tvq_exp.attention.linear.naive import linear_attention as linear_reference
from tvq_exp.models.blocks import GAUBlock, MHABlock
from tvq_exp.models.decoder import Decoder

B, H, T, D_K, D_V = 2, 4, 23, 6, 5  # head dims deliberately not powers of two
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def sized(name: str, **options) -> AttentionBackend:
    """Backend ``name`` at these tests' sizes (``D_K, D_V, H``) with ``options`` (:func:`~tests.attention.backends.build`:
    ``window_bias`` gives it the XL bias a block would)."""
    return build(name, d_k=D_K, d_v=D_V, heads=H, **options)


def decode_token_by_token(
    attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """``attn``'s outputs when ``q, k, v (B, H, T, d)`` are fed one position at a time, carrying the state."""
    state, outs = None, []
    for t in range(q.shape[2]):
        out, state, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        outs.append(out)
    return torch.cat(outs, 2)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def inputs(dtype: torch.dtype, kv_heads: int, t: int = T, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, D_K, generator=g, dtype=torch.float64) * 0.7
    k = torch.randn(B, kv_heads, t, D_K, generator=g, dtype=torch.float64) * 0.7
    v = torch.randn(B, kv_heads, t, D_V, generator=g, dtype=torch.float64)
    return tuple(x.to(dtype).requires_grad_(True) for x in (q, k, v))


def check_against_reference(
    attn: torch.nn.Module,
    reference,
    dtype: torch.dtype,
    kv_heads: int,
    qkv: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """Forward and q/k/v gradients of ``attn`` in ``dtype`` against ``reference`` in float64, on ``qkv`` (in
    ``dtype``, taking gradients; default :func:`inputs`)."""
    attn = attn.to(dtype)
    ref_attn = copy.deepcopy(attn).double()
    q, k, v = inputs(dtype, kv_heads) if qkv is None else qkv
    out = attn(q, k, v)[0]
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    ref = reference(ref_attn, q64, k64, v64)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out, ref) < TOL[dtype]
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to(dtype))
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out)
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        assert rel_err(g, rg) < TOL[dtype], name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("feature_map", ["elu1", "relu", "favor"])
@pytest.mark.parametrize("chunk_size", [1, 5, 8, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_linear_equals_reference(dtype: torch.dtype, feature_map: str, chunk_size: int, causal: bool) -> None:
    attn = sized(
        "linear",
        causal=causal,
        kv_heads=2,
        feature_map=feature_map,
        chunk_size=chunk_size,
        num_features=9,
    )
    check_against_reference(attn, linear_reference, dtype, kv_heads=2)


@pytest.mark.parametrize("feature_map", ["elu1", "favor"])
def test_chunk_size_never_changes_the_result(feature_map: str) -> None:
    q, k, v = inputs(torch.float64, kv_heads=H)
    outs = []
    for c in (1, 3, 7, 16, 23, 100):
        attn = sized("linear", feature_map=feature_map, chunk_size=c).double()
        outs.append(attn(q, k, v)[0])
    for out in outs[1:]:
        assert rel_err(out, outs[0]) < 1e-12


@pytest.mark.parametrize("feature_map", ["elu1", "favor"])
def test_backend_streaming_and_decoding(feature_map: str) -> None:
    attn = sized("linear", kv_heads=1, feature_map=feature_map, chunk_size=4).double()
    q, k, v = inputs(torch.float64, kv_heads=1)
    full = attn(q, k, v)[0]
    state, parts = None, []
    for a, b in ((0, 6), (6, 17), (17, T)):
        out, state, _ = attn(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state)
        parts.append(out)
    assert rel_err(torch.cat(parts, 2), full) < 1e-12
    assert (
        state.position == T and state.s.shape == (B, 1, attn.d_f, D_V) and state.z.shape == (B, 1, attn.d_f)
    )
    assert rel_err(decode_token_by_token(attn, q, k, v), full) < 1e-12


def test_state_and_normaliser_are_fp32_under_half_inputs() -> None:
    attn = sized("linear", chunk_size=4)
    q, k, v = (x.detach().bfloat16() for x in inputs(torch.float32, kv_heads=H))
    out, state, _ = attn(q, k, v)
    assert out.dtype == torch.bfloat16
    assert state.s.dtype == torch.float32 and state.z.dtype == torch.float32
    ref = linear_reference(copy.deepcopy(attn).double(), *(x.double() for x in (q, k, v)))
    assert rel_err(out, ref) < 2e-2


def test_favor_projection_is_seeded_and_redrawable() -> None:
    a, b = (sized("linear", feature_map="favor", num_features=11, seed=3) for _ in range(2))
    assert a.projection.shape == (11, D_K)
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(
        a.projection,
        sized("linear", feature_map="favor", num_features=11, seed=4).projection,
    )
    before = a.projection.clone()
    a.redraw()
    assert not torch.equal(a.projection, before)
    b.redraw()
    assert torch.equal(a.projection, b.projection)
    assert "projection" in a.state_dict()
    with pytest.raises(ValueError, match="favor"):
        sized("linear").redraw()


def test_xl_position_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="position=rope"):
        sized("linear", window_bias=True)
    with pytest.raises(ValueError, match="position=none"):
        GAUBlock(
            d_model=32, attention=functools.partial(build_attention, name="linear"), d_k=8, position="xl"
        )


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="feature_map"):
        sized("linear", feature_map="softmax")
    with pytest.raises(ValueError, match="chunk_size"):
        sized("linear", chunk_size=0)
    attn = sized("linear", causal=False)
    q, k, v = inputs(torch.float32, kv_heads=H)
    with pytest.raises(ValueError, match="causal"):
        attn(q, k, v, State(0))


def tiny_decoder(block: str, position: str, **attention) -> Decoder:
    torch.manual_seed(0)
    blk = (
        functools.partial(GAUBlock, d_k=12, position=position)
        if block == "gau"
        else functools.partial(MHABlock, heads=4, key_size=6, kv_heads=2, position=position)
    )
    att = functools.partial(build_attention, **attention)
    return Decoder(vocab_size=40, d_model=24, n_layers=2, block=blk, attention=att).double().eval()


def check_model_streaming(model: Decoder, t: int = 21) -> None:
    """Segment-split continuation and token-by-token decoding equal the parallel forward."""
    tokens = torch.randint(0, model.vocab_size, (2, t), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens).logits
        state, parts = None, []
        for a, b in ((0, 5), (5, 13), (13, t)):
            out = model(tokens[:, a:b], state)
            parts.append(out.logits)
            state = out.state
        assert rel_err(torch.cat(parts, 1), full) < 1e-10
        state, steps = None, []
        for i in range(t):
            out = model(tokens[:, i : i + 1], state)
            steps.append(out.logits)
            state = out.state
        assert rel_err(torch.cat(steps, 1), full) < 1e-10


@pytest.mark.parametrize("block", ["gau", "mha"])
@pytest.mark.parametrize("position,feature_map", [("rope", "elu1"), ("none", "favor"), ("rope", "relu")])
def test_model_streaming_and_decoding(block: str, position: str, feature_map: str) -> None:
    check_model_streaming(tiny_decoder(block, position, name="linear", feature_map=feature_map, chunk_size=4))
