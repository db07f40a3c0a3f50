"""``VQAttention(cache_key_grad=True)``: the cache scores' gradient reaches the cached keys, as if each code
were the mean of the keys quantised to it; the forward and every other gradient are the official ones."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tvq_exp.attention.vq.kernel import (
    CodeCache,
    WindowBias,
    WindowIndex,
    WindowInputs,
    window_cache_attention,
)
from tvq_exp.attention.vq.naive import vq_attention as vq_reference
from tvq_exp.attention.vq.naive import window_cache_attention as window_cache_reference


def make_pair(block_len: int, window_bias: bool = False, kv_heads: int | None = None, dtype=torch.float64):
    """The official layer and the same layer with ``cache_key_grad``, sharing every weight (S = 3: codes
    shared by several cached keys)."""
    opts = dict(d_k=6, d_v=5, heads=2, kv_heads=kv_heads, codebook_size=3, block_len=block_len)
    official = build("vq", window_bias=window_bias, **opts).to(dtype)
    if window_bias:
        torch.nn.init.normal_(official.bias.u)
        torch.nn.init.normal_(official.bias.v)
    keyed = build("vq", window_bias=window_bias, cache_key_grad=True, **opts).to(dtype)
    keyed.load_state_dict(official.state_dict())
    return official.eval(), keyed.eval()


def qkv(t: int, h_kv: int = 2, b: int = 2, dtype=torch.float64):
    mk = lambda h, d: torch.randn(b, h, t, d, dtype=dtype, requires_grad=True)
    return mk(2, 6), mk(h_kv, 6), mk(h_kv, 5)


@pytest.mark.parametrize("window_bias", [False, True])
@pytest.mark.parametrize("block_len,t,kv_heads", [(3, 12, None), (4, 13, None), (2, 11, 1), (5, 23, None)])
def test_layer_equals_the_plain_reference_forward_and_gradients_fp64(
    window_bias: bool, block_len: int, t: int, kv_heads: int | None
) -> None:
    official, keyed = make_pair(block_len, window_bias, kv_heads)
    q, k, v = qkv(t, h_kv=kv_heads or 2)
    out, _, _ = keyed(q, k, v)
    ref = vq_reference(keyed, q, k, v)
    assert torch.allclose(out, ref, atol=1e-10, rtol=0)
    assert torch.equal(out, official(q, k, v)[0])  # the forward is exactly the official one
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad((ref * g).sum(), (q, k, v)), strict=True):
        assert torch.allclose(got, want, atol=1e-10, rtol=0)
    dq, dk, dv = torch.autograd.grad((official(q, k, v)[0] * g).sum(), (q, k, v))
    assert torch.allclose(grads[0], dq, atol=1e-12) and torch.allclose(grads[2], dv, atol=1e-12)
    assert (grads[1] - dk).abs().max() > 1e-6  # only the keys' gradient changes


def test_a_far_query_gives_each_cached_key_its_share_of_the_code_gradient() -> None:
    """By hand, for the last query (block 3 of L = 3, no bias): the cached keys (blocks 0, 1) of code ``s``
    each get ``(1/n_s)·Σ_{j: z_j = s} p_j (g·v_j - g·out)·q``; the official layer gives them nothing."""
    official, keyed = make_pair(3)
    q, k, v = qkv(12, b=1)
    out = keyed(q, k, v)[0][:, :, -1]  # (1, H, d_v)
    g = torch.randn_like(out)
    dk = torch.autograd.grad((out * g).sum(), k)[0]
    assert torch.autograd.grad((official(q, k, v)[0][:, :, -1] * g).sum(), k)[0][:, :, :6].abs().sum() == 0
    k_hat, codes, _ = keyed.quantizer(k)
    with torch.no_grad():
        for h in range(2):
            p = torch.softmax(q[0, h, -1] @ k_hat[0, h].T, dim=-1)  # all 12 keys are visible
            dlogit = p * (v[0, h] @ g[0, h] - out[0, h] @ g[0, h])
            for s in range(3):
                cached = (codes[0, h, :6] == s).nonzero().flatten()
                if len(cached):
                    want = dlogit[cached].sum() / len(cached) * q[0, h, -1]
                    assert torch.allclose(dk[0, h, cached], want.expand(len(cached), -1), atol=1e-12)


@pytest.mark.parametrize("window_bias", [False, True])
def test_causal_by_jacobian(window_bias: bool) -> None:
    _, keyed = make_pair(3, window_bias)
    q, k, v = (x.detach()[:1] for x in qkv(10))

    def f(x: torch.Tensor) -> torch.Tensor:
        return keyed(x[..., :6], x[..., 6:12], x[..., 12:], None)[0]

    jac = torch.autograd.functional.jacobian(f, torch.cat([q, k, v], -1))  # (1,2,T,5, 1,2,T,17)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(per_pos.triu(1) == 0)
    key_grad = jac[..., 6:12].abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert key_grad[-1, :3].sum() > 0  # the last query reaches block 0's keys through the cache


def test_streaming_with_a_carried_state_equals_one_shot() -> None:
    official, keyed = make_pair(3, window_bias=True)
    q, k, v = qkv(14)
    whole = keyed(q, k, v)[0]
    first, state, _ = keyed(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    second, _, _ = keyed(q[:, :, 8:], k[:, :, 8:], v[:, :, 8:], state)
    assert torch.allclose(torch.cat([first, second], 2), whole, atol=1e-12)
    dk = torch.autograd.grad(second.sum(), k)[0]
    assert dk[:, :, :8].abs().sum() == 0  # a carried state takes no gradient, as the official layer's


def test_kernel_per_item_codebook_gradient_equals_the_reference_for_every_chunk_size() -> None:
    n, items, rows, block, s, dk, dv = 2, 5, 4, 4, 7, 6, 5
    mk = lambda *shape: torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    counts = torch.randint(0, 3, (n, items, s)).double()
    inputs = {
        "q": mk(n, items, 2 * rows, dk),
        "kb": mk(n, items + 1, block, dk),
        "vb": mk(n, items + 1, block, dv),
        "bias_q": mk(n, items, 2 * rows, dk),
        "rel": mk(n, 2, 4, dk),
        "codebook": mk(n, items, s, dk),
        "log_n": torch.where(counts > 0, counts.log(), float("-inf")),
        "mu": mk(n, items, s, dv),
    }
    wrt = [x for x in inputs.values() if x.requires_grad]
    tensors = WindowInputs(
        inputs["q"], inputs["kb"], inputs["vb"], WindowIndex.of_block(block, 0, rows, False, 3),
        WindowBias(inputs["bias_q"], inputs["rel"]),
        CodeCache(inputs["codebook"], inputs["log_n"], inputs["mu"]), prev_masked=True,
    )  # fmt: skip
    ref = window_cache_reference(tensors)
    g = torch.randn_like(ref)
    want = torch.autograd.grad((ref * g).sum(), wrt)
    assert want[-2].abs().sum() > 0  # the codebook's gradient
    for chunk in (1, 2, 5):
        out = window_cache_attention(tensors, chunk=chunk)
        assert torch.allclose(out, ref, atol=1e-12, rtol=0)
        for got, exp in zip(torch.autograd.grad((out * g).sum(), wrt), want, strict=True):
            assert torch.allclose(got, exp, atol=1e-11, rtol=0)


@pytest.mark.parametrize("bad", [{"grad_through_cache": False}, {"causal": False}, {"kernel": "flex"}])
def test_incompatible_options_are_refused(bad: dict) -> None:
    opts = {"d_k": 4, "d_v": 4, "codebook_size": 8, "block_len": 4, "cache_key_grad": True} | bad
    with pytest.raises(ValueError, match="cache_key_grad"):
        build("vq", **opts)
