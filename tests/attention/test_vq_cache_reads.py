"""How the cache is read (issue 43's remedies): ``cache_code_grad`` (the cache scores' gradient reaches the codes) and
``cache_keys="mean"`` (each code read by the running mean of the sequence's own keys quantised to it).

The VQ invariants for each: equal to the plain dense reference (``naive.vq_attention``), forward and every gradient;
streaming and token-by-token decoding equal to one shot; causal; a hand-worked case of the new rule; the cache
switched off gives the official sliding window."""

from __future__ import annotations

import pytest
import torch

from tests.attention.backends import build
from tvq_exp.attention.vq.naive import vq_attention as vq_reference

DK, DV = 6, 5


def make(block_len: int = 3, window_bias: bool = False, dtype=torch.float64, **opts):  # noqa: ANN001, ANN201
    """A ``VQAttention`` (S = 3 by default: codes shared by several cached keys), with the official one sharing its
    weights (same codebook rule, ``cache_keys=code``, no code gradient)."""
    opts = dict(d_k=DK, d_v=DV, heads=2, codebook_size=3, block_len=block_len) | opts
    attn = build("vq", window_bias=window_bias, **opts).to(dtype)
    if window_bias:
        torch.nn.init.normal_(attn.bias.u)
        torch.nn.init.normal_(attn.bias.v)
    official_opts = {k: v for k, v in opts.items() if k not in ("cache_code_grad", "cache_keys")}
    official = build("vq", window_bias=window_bias, **official_opts).to(dtype)
    official.load_state_dict(attn.state_dict())
    return attn.eval(), official.eval()


def qkv(t: int, h_kv: int = 2, b: int = 2, dtype=torch.float64):  # noqa: ANN201
    mk = lambda h, d: torch.randn(b, h, t, d, dtype=dtype, requires_grad=True)
    return mk(2, DK), mk(h_kv, DK), mk(h_kv, DV)


def assert_equals_the_plain_reference(attn, q, k, v):  # noqa: ANN001, ANN201
    """The layer against ``naive.vq_attention`` (fp64, 1e-10): the output and the gradients of ``q, k, v`` and every
    trainable parameter (None on both sides or equal). Returns the output, its gradients and the cotangent used."""
    out = attn(q, k, v)[0]
    ref = vq_reference(attn, q, k, v)
    assert torch.allclose(out, ref, atol=1e-10, rtol=0)
    params = [p for p in attn.parameters() if p.requires_grad]
    g = torch.randn_like(out)
    got = torch.autograd.grad((out * g).sum(), (q, k, v, *params), allow_unused=True)
    want = torch.autograd.grad((ref * g).sum(), (q, k, v, *params), allow_unused=True)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-10, rtol=0)
    return out, got, g


MEAN = {"cache_keys": "mean"}
CODE_GRAD = {"cache_code_grad": True, "codebook": {"update": "gradient"}}


@pytest.mark.parametrize("opts", [MEAN, CODE_GRAD], ids=["mean keys", "code grad"])
@pytest.mark.parametrize("window_bias", [False, True])
@pytest.mark.parametrize("block_len,t,kv_heads", [(3, 12, None), (4, 13, None), (2, 11, 1), (5, 23, None)])
def test_layer_equals_the_plain_reference_forward_and_gradients_fp64(
    opts: dict, window_bias: bool, block_len: int, t: int, kv_heads: int | None
) -> None:
    torch.manual_seed(0)
    attn, official = make(block_len, window_bias, kv_heads=kv_heads, **opts)
    q, k, v = qkv(t, h_kv=kv_heads or 2)
    out, got, g = assert_equals_the_plain_reference(attn, q, k, v)
    official_out = official(q, k, v)[0]
    if opts is CODE_GRAD:  # the forward is the official one; the codes take a gradient they did not
        assert torch.equal(out, official_out)
        codes_grad = got[
            3 + [n for n, _ in attn.named_parameters() if _.requires_grad].index("quantizer.embed")
        ]
        assert codes_grad.abs().sum() > 0
        official_grad = torch.autograd.grad(
            (official_out * g).sum(), official.quantizer.embed, allow_unused=True
        )[0]
        assert official_grad is None or official_grad.abs().sum() == 0
    elif t > 2 * block_len:  # a query beyond two blocks reads the cache, now by the key means
        assert (out - official_out).abs().max() > 1e-6


def test_mean_keys_by_hand() -> None:
    """The last query (block 3 of L = 3, no bias, one head): softmax over its window (blocks 2 and 3, quantised
    keys ``C_z``, causal) and the cache entries of blocks 0 and 1: per code ``s`` the score ``q·m_s + log n_s``,
    ``m_s`` the mean of the keys (before quantisation) of code ``s``, the value the mean ``μ_s`` of their values."""
    torch.manual_seed(3)
    attn, _ = make(heads=1, **MEAN)
    q, k, v = (x.detach() for x in qkv(12, h_kv=1, b=1))
    q, k, v = q[:, :1], k[:, :1], v[:, :1]
    out = attn(q, k, v)[0][0, 0, -1]
    k_hat, codes, _ = attn.quantizer(k)
    qi, z = q[0, 0, -1], codes[0, 0]
    scores, values = [], []
    for j in range(6, 12):  # the window: blocks 2 and 3, all visible to the last position
        scores.append(qi @ k_hat[0, 0, j])
        values.append(v[0, 0, j])
    for s in range(3):
        members = [j for j in range(6) if z[j] == s]
        if members:
            mean_key = k[0, 0, members].mean(0)
            scores.append(qi @ mean_key + torch.log(torch.tensor(float(len(members)), dtype=q.dtype)))
            values.append(v[0, 0, members].mean(0))
    p = torch.softmax(torch.stack(scores), 0)
    want = (p[:, None] * torch.stack(values)).sum(0)
    assert torch.allclose(out, want, atol=1e-12)


def test_code_grad_by_hand() -> None:
    """The last query (block 3 of L = 3, no bias): code ``s`` gets ``Σ_{j cached, z_j = s} p_j (g·v_j - g·out)·q``
    from the cache scores, nothing from the window (its keys carry the straight-through gradient to the keys)."""
    torch.manual_seed(4)
    attn, _ = make(heads=1, **CODE_GRAD)
    q, k, v = (x.detach() for x in qkv(12, h_kv=1, b=1))
    q, k, v = q[:, :1], k[:, :1], v[:, :1]
    out = attn(q, k, v)[0][0, 0, -1]
    g = torch.randn_like(out)
    grad = torch.autograd.grad((out * g).sum(), attn.quantizer.embed)[0][0]
    with torch.no_grad():
        k_hat, codes, _ = attn.quantizer(k)
        qi, z = q[0, 0, -1], codes[0, 0]
        p = torch.softmax(qi @ k_hat[0, 0].T, 0)  # all 12 keys are visible to the last position
        dlogit = p * (v[0, 0] @ g - out @ g)
        want = torch.zeros_like(grad)
        for j in range(6):
            want[z[j]] += dlogit[j] * qi
    assert torch.allclose(grad, want, atol=1e-12)


@pytest.mark.parametrize("window_bias", [False, True])
def test_mean_keys_stream_and_decode_as_one_shot(window_bias: bool) -> None:
    torch.manual_seed(5)
    attn, _ = make(window_bias=window_bias, **MEAN)
    q, k, v = (x.detach() for x in qkv(16))
    whole = attn(q, k, v)[0]
    pieces, state, start = [], None, 0
    for end in (7, 8, 13, 16):  # a cut inside a block, one position, across a block, the rest
        out, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        pieces.append(out)
        start = end
    assert torch.allclose(torch.cat(pieces, 2), whole, atol=1e-12)
    steps, state = [], None
    for t in range(16):  # token by token
        out, state, _ = attn(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        steps.append(out)
    assert torch.allclose(torch.cat(steps, 2), whole, atol=1e-12)
    assert state.cache_k.shape == (2, 2, 3, DK) and state.raw_k.shape == state.k.shape  # positions 12..15


@pytest.mark.parametrize("opts", [MEAN, CODE_GRAD], ids=["mean keys", "code grad"])
def test_causal_by_jacobian(opts: dict) -> None:
    torch.manual_seed(6)
    attn, _ = make(window_bias=True, **opts)
    q, k, v = (x.detach()[:1] for x in qkv(10))

    def f(x: torch.Tensor) -> torch.Tensor:
        return attn(x[..., :DK], x[..., DK : 2 * DK], x[..., 2 * DK :], None)[0]

    jac = torch.autograd.functional.jacobian(f, torch.cat([q, k, v], -1))  # (1,2,T,5, 1,2,T,17)
    per_pos = jac.abs().sum(dim=(0, 1, 3, 4, 5, 7))
    assert torch.all(per_pos.triu(1) == 0)
    if opts is MEAN:  # the last query reaches block 0's keys through their mean in the cache
        assert jac[..., DK : 2 * DK].abs().sum(dim=(0, 1, 3, 4, 5, 7))[-1, :3].sum() > 0


def test_cache_off_is_the_official_sliding_window() -> None:
    """The paired cache-off evaluation: ``use_cache=False`` reads no cache, so both options give the official
    layer's sliding window exactly."""
    torch.manual_seed(7)
    for opts in (MEAN, CODE_GRAD):
        attn, official = make(window_bias=True, use_cache=False, window_len=2, **opts)
        q, k, v = qkv(14)
        assert torch.equal(attn(q, k, v)[0], official(q, k, v)[0])


def test_state_floats_count_the_key_means() -> None:
    attn, official = make(**MEAN)
    t = 20
    window_positions = official.state_floats(t) // 2 - 3 * (1 + DV)  # per head, less the cache
    window_positions //= DK + DV + 1
    assert attn.state_floats(t) == official.state_floats(t) + 2 * (3 * DK + window_positions * DK)


@pytest.mark.parametrize(
    "opts,match",
    [
        ({"cache_code_grad": True}, "trainable codebook"),  # EMA codes are buffers
        ({**CODE_GRAD, "grad_through_cache": False}, "cache_code_grad"),
        ({**CODE_GRAD, "kernel": "flex"}, "cache_code_grad"),
        ({**CODE_GRAD, "causal": False}, "cache_code_grad"),
        ({**CODE_GRAD, "cache_keys": "mean"}, "cache_code_grad"),
        ({**MEAN, "cache_key_grad": True}, "cache_keys"),
        ({**MEAN, "kernel": "flex"}, "cache_keys"),
        ({**MEAN, "causal": False}, "cache_keys"),
        ({"cache_keys": "means"}, "cache_keys"),
    ],
)
def test_incompatible_options_are_refused(opts: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build("vq", d_k=4, d_v=4, codebook_size=8, block_len=4, **opts)
