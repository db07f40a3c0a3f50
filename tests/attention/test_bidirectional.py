"""Encoder (``causal=False``) mode of every backend; for vq the O(T·S) codebook form with the
two-sided window bias, equal to dense encoder softmax over the quantised keys."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tests.attention.test_flash_chunk import with_random_bias
from tests.attention.test_linear import D_K, D_V, H, T, check_against_reference, inputs, rel_err, sized
from tests.helpers.xl_bias import xl_bias_matrix
from tvq_exp.attention import State
from tvq_exp.attention.dense.naive import dense_attention as dense_reference
from tvq_exp.attention.dense.naive import softmax_attention
from tvq_exp.attention.vq import VQAttention
from tvq_exp.attention.vq.naive import vq_attention as vq_window_reference


def vq_attention(causal: bool = False, **options) -> VQAttention:
    torch.manual_seed(0)
    options = {"codebook_size": 8, "block_len": 5, "window_len": 4, **options}
    return with_random_bias(sized("vq", causal=causal, kv_heads=2, **{"window_bias": True, **options})).eval()


VQ_OPTIONS = [
    {},
    {"block_len": 4, "window_len": 4},
    {"block_len": 9, "window_len": 2},
    {"block_len": 30},
    {"window_bias": False},
    {"use_cache": False},
    {"grad_through_cache": False},
    {"block_len": 3, "window_len": 0},
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "options", VQ_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default"
)
def test_vq_encoder_equals_reference(dtype: torch.dtype, options: dict) -> None:
    check_against_reference(vq_attention(**options), vq_window_reference, dtype, kv_heads=2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vq_causal_matches_the_same_reference(dtype: torch.dtype) -> None:
    """The encoder reference reduces to the causal backend when masked causally (one definition)."""
    check_against_reference(vq_attention(causal=True), vq_window_reference, dtype, kv_heads=2)


def test_vq_encoder_is_independent_of_block_len() -> None:
    q, k, v = inputs(torch.float64, kv_heads=2)
    outs = []
    for block_len in (4, 5, 7, 11, 23, 64):
        attn = vq_attention(block_len=block_len).double()
        outs.append(attn(q, k, v)[0])
    for out in outs[1:]:
        assert rel_err(out, outs[0]) < 1e-12


def test_vq_encoder_equals_dense_encoder_over_quantised_keys() -> None:
    """Same bias parameters in a dense encoder fed the quantised keys: the same values."""
    vq = vq_attention().double()
    dense = sized("dense", causal=False, kv_heads=2, window_bias=True, window_len=4).double()
    dense.bias.load_state_dict(vq.bias.state_dict())
    q, k, v = inputs(torch.float64, kv_heads=2)
    k_hat = vq.quantizer(k)[0]
    assert rel_err(vq(q, k, v)[0], dense(q, k_hat, v)[0]) < 1e-12


def test_encoder_bias_is_two_sided_and_extends_the_causal_bias() -> None:
    attn = vq_attention().double()
    q = inputs(torch.float64, kv_heads=2)[0]
    dist = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    two_sided = attn.bias.encoder_bias(q, dist)
    assert rel_err(two_sided, xl_bias_matrix(attn.bias, q, causal=False)) < 1e-6  # fp32 sinusoid table
    causal = two_sided.masked_fill(dist < 0, 0.0)
    assert rel_err(causal, attn.bias.bias(q, dist)) < 1e-12
    assert (two_sided.masked_fill(dist.abs() <= 4, 0.0) == 0).all()
    assert (two_sided[..., dist < 0] != 0).any()


@pytest.mark.parametrize(
    "name,options",
    [
        ("dense", {"window_bias": True, "window_len": 4}),
        ("dense", {"talking_heads": True, "score": "relu2"}),
        ("linear", {"feature_map": "elu1", "chunk_size": 4}),
        ("flash_chunk", {"group_size": 6, "window_bias": True, "window_len": 3}),
    ],
)
def test_every_backend_has_a_non_causal_form(name: str, options: dict) -> None:
    """Encoder outputs depend on future inputs (and equal the references in the other test files)."""
    attn = with_random_bias_any(build(name, d_k=D_K, d_v=D_V, heads=H, causal=False, **options)).double()
    q, k, v = inputs(torch.float64, kv_heads=H)
    out = attn(q, k, v)[0]
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, -1] += 1.0
    v2[:, :, -1] += 1.0
    assert (attn(q, k2, v2)[0][:, :, 0] - out[:, :, 0]).abs().max() > 1e-6


def with_random_bias_any(attn: torch.nn.Module) -> torch.nn.Module:
    return with_random_bias(attn) if getattr(attn, "bias", None) is not None else attn


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_encoder_bias_equals_reference(dtype: torch.dtype) -> None:
    attn = with_random_bias(sized("dense", causal=False, kv_heads=2, window_bias=True, window_len=4))
    check_against_reference(attn, dense_reference, dtype, kv_heads=2)


def test_dense_encoder_without_bias_is_plain_softmax() -> None:
    attn = sized("dense", causal=False).double()
    q, k, v = inputs(torch.float64, kv_heads=H)
    assert rel_err(attn(q, k, v)[0], softmax_attention(q, k, v, causal=False)) < 1e-12


def test_vq_encoder_refuses_a_state_and_returns_aux() -> None:
    attn = vq_attention()
    q, k, v = inputs(torch.float32, kv_heads=2)
    out, state, aux = attn(q, k, v)
    assert out.shape == (q.shape[0], H, T, D_V) and state == State(T) and "commit_loss" in aux
    with pytest.raises(ValueError, match="causal"):
        attn(q, k, v, state)
