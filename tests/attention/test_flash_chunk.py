"""FLASH mixed chunk attention and FLASH-Quad (dense ReLU²): equal their masked-quadratic references;
streaming and decoding equal the parallel forward (backend and model level)."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tests.attention.test_linear import (
    H,
    T,
    check_against_reference,
    check_model_streaming,
    decode_token_by_token,
    inputs,
    rel_err,
    sized,
    tiny_decoder,
)
from tvq_exp.attention import State
from tvq_exp.attention.dense.naive import dense_attention as dense_reference
from tvq_exp.attention.flash_chunk import FlashChunkAttention
from tvq_exp.attention.flash_chunk.naive import flash_chunk_attention as flash_chunk_reference


def with_random_bias(attn: torch.nn.Module) -> torch.nn.Module:
    """Non-zero ``u, v`` so the content query and bias terms are exercised."""
    if attn.bias is not None:
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            attn.bias.u.copy_(torch.randn(attn.bias.u.shape, generator=g) * 0.5)
            attn.bias.v.copy_(torch.randn(attn.bias.v.shape, generator=g) * 0.5)
    return attn


FLASH_OPTIONS = [
    {"group_size": 5},
    {"group_size": 8, "window_bias": True, "window_len": 3},
    {"group_size": 1},
    {"group_size": 64, "window_bias": True},
    {"group_size": 6, "score": "softmax", "window_bias": True, "window_len": 4},
    {"group_size": 7, "norm": "fixed", "norm_scale": 3.0},
    {"group_size": 4, "score": "softmax", "norm": "fixed"},
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("options", FLASH_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("causal", [True, False])
def test_flash_chunk_equals_reference(dtype: torch.dtype, options: dict, causal: bool) -> None:
    attn = with_random_bias(sized("flash_chunk", causal=causal, kv_heads=2, **options))
    check_against_reference(attn, flash_chunk_reference, dtype, kv_heads=2)


@pytest.mark.parametrize("options", FLASH_OPTIONS[:2] + FLASH_OPTIONS[4:5], ids=["plain", "bias", "softmax"])
def test_flash_chunk_streaming_and_decoding(options: dict) -> None:
    attn = with_random_bias(sized("flash_chunk", kv_heads=1, **options)).double()
    q, k, v = inputs(torch.float64, kv_heads=1)
    full = attn(q, k, v)[0]
    for cuts in ((0, 3, 11, 12, T), tuple(range(T + 1))):
        state, parts = None, []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            out, state, _ = attn(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state)
            parts.append(out)
        assert rel_err(torch.cat(parts, 2), full) < 1e-12
    g = attn.group_size
    assert state.position == T and state.n == (T // g) * g and state.k.shape[2] == T % g


@pytest.mark.parametrize("options", FLASH_OPTIONS[:1] + FLASH_OPTIONS[4:5], ids=["relu2", "softmax"])
def test_a_state_whose_count_is_an_int_continues_as_the_state_of_now(options: dict) -> None:
    """The count ``n`` of the positions before the partial group is a 0-d int64 tensor (compiled code takes it as
    an input); a checkpoint's state of before, when it was an int, holds the same tensor, and continues the same,
    inside a group and across groups."""
    attn = with_random_bias(sized("flash_chunk", kv_heads=1, **options)).double()
    q, k, v = inputs(torch.float64, kv_heads=1)
    _, state, _ = attn(q[:, :, :13], k[:, :, :13], v[:, :, :13])
    assert state.n.dtype == torch.long and state.n.dim() == 0
    old = type(state)(state.position, state.k, state.v, state.kv, int(state.n))
    assert old == state
    for end in (14, T):
        rest = (q[:, :, 13:end], k[:, :, 13:end], v[:, :, 13:end])
        assert torch.equal(attn(*rest, old)[0], attn(*rest, state)[0])


def test_flash_chunk_normaliser_never_uses_the_total_length() -> None:
    """A prefix of the sequence gives exactly the prefix of the outputs (no length-dependent scale)."""
    attn = sized("flash_chunk", group_size=4).double()
    q, k, v = inputs(torch.float64, kv_heads=H)
    full = attn(q, k, v)[0]
    assert rel_err(attn(q[:, :, :9], k[:, :, :9], v[:, :, :9])[0], full[:, :, :9]) < 1e-14


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("window_bias", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_quad_equals_reference(dtype: torch.dtype, window_bias: bool, causal: bool) -> None:
    attn = with_random_bias(
        sized(
            "dense",
            causal=causal,
            kv_heads=2,
            score="relu2",
            window_bias=window_bias,
            window_len=5,
        )
    )
    check_against_reference(attn, dense_reference, dtype, kv_heads=2)


@pytest.mark.parametrize("score", ["relu2", "softmax"])
def test_dense_streaming_and_decoding(score: str) -> None:
    attn = with_random_bias(
        sized(
            "dense",
            score=score,
            window_bias=True,
            window_len=4,
            talking_heads=True,
        )
    ).double()
    q, k, v = inputs(torch.float64, kv_heads=H)
    full = attn(q, k, v)[0]
    assert rel_err(decode_token_by_token(attn, q, k, v), full) < 1e-12


def test_softmax_default_paths_unchanged() -> None:
    """``score='softmax'`` without talking heads still matches plain softmax attention."""
    attn = sized("dense", kv_heads=2).double()
    q, k, v = inputs(torch.float64, kv_heads=2)
    assert rel_err(attn(q, k, v)[0], dense_reference(attn, q, k, v)) < 1e-12


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="score"):
        sized("dense", score="relu")
    with pytest.raises(ValueError, match="score"):
        sized("flash_chunk", score="relu")
    with pytest.raises(ValueError, match="norm"):
        sized("flash_chunk", norm="length")
    with pytest.raises(ValueError, match="group_size"):
        sized("flash_chunk", group_size=0)
    q, k, v = inputs(torch.float32, kv_heads=H)
    with pytest.raises(ValueError, match="causal"):
        sized("flash_chunk", causal=False)(q, k, v, State(0))


@pytest.mark.parametrize("block", ["gau", "mha"])
@pytest.mark.parametrize(
    "position,attention",
    [
        ("xl", {"name": "flash_chunk", "group_size": 4, "window_len": 3}),
        ("rope", {"name": "flash_chunk", "group_size": 5, "score": "softmax"}),
        ("xl", {"name": "dense", "score": "relu2", "window_len": 6}),
    ],
    ids=["flash-xl", "flash-softmax-rope", "flash-quad-xl"],
)
def test_model_streaming_and_decoding(block: str, position: str, attention: dict) -> None:
    check_model_streaming(tiny_decoder(block, position, **attention))


def test_registered() -> None:
    attn = sized("flash_chunk", group_size=3)
    assert isinstance(attn, FlashChunkAttention)


@pytest.mark.parametrize("score", ["relu2", "softmax"])
def test_decoding_one_token_costs_its_own_row_not_a_padded_group(score: str) -> None:
    """A decoding step inside a group scores its one query against the group's keys so far."""
    from torch.utils.flop_counter import FlopCounterMode

    g, d = 64, 16
    attn = build("flash_chunk", d_k=d, d_v=d, group_size=g, score=score, window_bias=True)
    x = torch.randn(1, 1, 2 * g + 9, d)
    _, state, _ = attn(x, x, x)
    with FlopCounterMode(display=False) as counter:
        attn(x[:, :, :1], x[:, :, :1], x[:, :, :1], state)
    keys = 10  # 9 buffered + the new one
    per_row = 2 * (keys * d * 2 + d * d) + 2 * (g + 1) * d  # scores, values, linear term, bias logits
    assert counter.get_total_flops() <= per_row + 2 * (g + 1) * d * d  # + the relative embeddings' projection
