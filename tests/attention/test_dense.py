"""Dense backend: equals the plain masked-softmax reference, is causal, and streams exactly."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tests.attention.test_linear import check_against_reference, sized
from tests.helpers.xl_bias import content_query, xl_bias_matrix
from tvq_exp.attention.dense.naive import softmax_attention


def _qkv(b=2, h=2, t=11, dk=5, dv=3, hk=None, dtype=torch.float64):
    hk = hk or h
    q = torch.randn(b, h, t, dk, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hk, t, dk, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hk, t, dv, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_dense_equals_reference_fp64(kv_heads: int) -> None:
    """Forward and gradients against plain masked softmax (keys and values shared by ``H / kv_heads`` heads)."""
    reference = lambda _, q, k, v: softmax_attention(q, k, v)  # noqa: E731
    check_against_reference(sized("dense", kv_heads=kv_heads), reference, torch.float64, kv_heads)


def test_dense_with_window_bias_equals_reference() -> None:
    attn = build("dense", d_k=4, d_v=3, heads=2, window_bias=True, window_len=3).double()
    torch.nn.init.normal_(attn.bias.u)
    torch.nn.init.normal_(attn.bias.v)
    q, k, v = _qkv(dk=4)
    out, _, _ = attn(q, k, v)
    ref = softmax_attention(content_query(attn.bias, q), k, v, bias=xl_bias_matrix(attn.bias, q, causal=True))
    assert torch.allclose(out, ref, atol=1e-6, rtol=0)  # the module's sinusoid table is fp32


def test_dense_fp32_matches_fp64_reference() -> None:
    attn = build("dense", d_k=8, d_v=8, heads=2)
    q, k, v = (x.detach() for x in _qkv(dk=8, dv=8, t=40, dtype=torch.float32))
    out, _, _ = attn(q, k, v)
    ref = softmax_attention(q.double(), k.double(), v.double())
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window_bias", [False, True])
def test_dense_causal_by_jacobian(window_bias: bool) -> None:
    attn = build("dense", d_k=4, d_v=3, heads=1, window_bias=window_bias, window_len=4).double()
    t = 7
    q, k, v = (x.detach() for x in _qkv(b=1, h=1, t=t, dk=4))

    def f(x: torch.Tensor) -> torch.Tensor:
        return attn(x[..., :4], x[..., 4:8], x[..., 8:], None)[0]

    jac = torch.autograd.functional.jacobian(f, torch.cat([q, k, v], -1))  # (1,1,T,3, 1,1,T,11)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))  # (T_out, T_in)
    assert torch.all(per_pos.triu(1) == 0)
    assert torch.all(per_pos.diagonal() > 0) and per_pos.tril(-1).sum() > 0


def test_dense_state_continuation_and_decoding() -> None:
    attn = build("dense", d_k=4, d_v=3, heads=2, window_bias=True, window_len=3).double()
    q, k, v = (x.detach() for x in _qkv(dk=4, t=12))
    full, _, _ = attn(q, k, v)
    a, st, _ = attn(q[:, :, :5], k[:, :, :5], v[:, :, :5])
    b, _, _ = attn(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], st)
    assert torch.allclose(torch.cat([a, b], 2), full, atol=1e-12)
    st, outs = None, []
    for t in range(12):
        o, st, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], st)
        outs.append(o)
    assert torch.allclose(torch.cat(outs, 2), full, atol=1e-12)


def test_unknown_backend_and_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="name='nope': unknown attention backend"):
        build("nope", d_k=4, d_v=4)
    attn = build("dense", d_k=4, d_v=3, heads=2)
    with pytest.raises(ValueError, match="expected"):
        attn(torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 3))


CAUSAL_EXPLICIT = [
    {"window_bias": True, "window_len": 3},
    {"score": "relu2"},
    {"talking_heads": True, "talking_heads_post": True, "window_bias": True, "window_len": 4},
]


@pytest.mark.parametrize(
    ("options", "past"),
    [
        *((o, 0) for o in CAUSAL_EXPLICIT),
        *((o, 6) for o in CAUSAL_EXPLICIT),
        ({"causal": False, "window_bias": True, "window_len": 3}, 0),
    ],
)
def test_explicit_logits_in_row_chunks_equal_one_chunk(monkeypatch, options: dict, past: int) -> None:
    """Beyond the logits budget, chunks of query rows (checkpointed, causal ones over their visible
    keys only) give the same outputs and gradients as one full matrix, also after a carried state."""
    from tvq_exp.attention.dense import layer as dense

    attn = build("dense", d_k=4, d_v=3, heads=2, **options).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.5)
    q, k, v = _qkv(dk=4, t=13)
    state = None
    if past:
        _, state, _ = attn(*(x[:, :, :past].detach() for x in (q, k, v)))
    params = [q, k, v, *attn.parameters()]

    def run() -> tuple[torch.Tensor, ...]:
        out, _, _ = attn(q, k, v, state)
        return (out, *torch.autograd.grad((out * torch.arange(out.numel()).view_as(out).sin()).sum(), params))

    whole = run()
    monkeypatch.setattr(dense, "LOGITS_BUDGET", 2 * 2 * (13 + past) * 3)  # rows of 3: five chunks
    assert len(dense.query_chunks(4, 13, 13 + past, past, attn.causal)) == 5
    for got, want in zip(run(), whole, strict=True):
        assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_chunked_explicit_logits_save_nothing_quadratic_for_the_backward(monkeypatch) -> None:
    """With row chunks, the autograd graph keeps only inputs (and views of them): the distinct
    storages it saves hold less than one T×T matrix in all."""
    from tvq_exp.attention.dense import layer as dense

    t = 256
    attn = build("dense", d_k=8, d_v=8, heads=1, window_bias=True, window_len=16)
    q, k, v = (torch.randn(1, 1, t, 8, requires_grad=True) for _ in range(3))
    saved: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        storage = x.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return x

    def saved_bytes() -> int:
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            attn(q, k, v)
        return sum(saved.values())

    whole = saved_bytes()
    monkeypatch.setattr(dense, "LOGITS_BUDGET", t * 16)  # rows of 16
    assert whole > 4 * t * t  # one chunk: the full logits are kept
    assert saved_bytes() < t * t  # chunks: q, k, v and the relative embeddings only
