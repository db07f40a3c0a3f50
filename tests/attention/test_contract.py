"""The backend contract (``tvq_exp/attention/base.py``), one parametrised test per rule over every backend in
``BACKENDS``: shapes and dtype, causality, streaming in segments equals one forward, the carried state round-trips
(cloned and resumed from gives the same outputs; its size is ``state_floats``), gradients equal to finite
differences.

The small options of every backend come from the shared table (``tests/attention/backends.py``); a backend added
to ``BACKENDS`` without its row there fails ``test_every_backend_has_a_row``. Each backend's agreement with its plain
reference is tested beside it (``test_<backend>.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.attention.backends import NAMES, ROWS, build, small_options
from tvq_exp.attention.base import AttentionBackend, State
from tvq_exp.attention.registry import BACKENDS
from tvq_exp.options import OptionError

B, H, D_K, D_V, L = 2, 2, 8, 6, 4
T = 6 * L  # long enough for the VQ / OVQ cache (blocks two back) to matter


def backend(name: str) -> AttentionBackend:
    """Backend ``name`` at block/group/chunk length ``L`` (segments of L or 2L exercise the state), with the XL
    bias where it takes one."""
    torch.manual_seed(0)
    return build(name, d_k=D_K, d_v=D_V, heads=H, **small_options(name, L)).double().eval()


def inputs(seed: int = 0, t: int = T) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, t, D_K, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(B, H, t, D_V, generator=g, dtype=torch.float64)


def elements(state: State) -> int:
    """Elements of every tensor in a state but its 0-d ones: a count the batch shares (FLASH's ``n``) is bookkeeping,
    as the position is."""
    return sum(t.numel() for t in state.tensors() if t.dim())


def test_every_backend_has_a_row() -> None:
    missing = set(BACKENDS) - set(ROWS)
    assert not missing, f"add a row of small options for {sorted(missing)} to tests/attention/backends.py"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtype(name: str, dtype: torch.dtype) -> None:
    attn = backend(name).to(dtype)
    q, k, v = (x.to(dtype) for x in inputs())
    out, state, aux = attn(q, k, v)
    assert out.shape == (B, H, T, D_V) and out.dtype == dtype
    assert bool(out.isfinite().all()) and isinstance(aux, dict)
    with pytest.raises(ValueError):
        attn(q[..., :-1], k, v)  # a wrong d_k is refused


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("t", [0, L - 1, 2 * L + 1, T - 1])
def test_causality(name: str, t: int) -> None:
    attn = backend(name)
    q, k, v = inputs()
    before = attn(q, k, v)[0]
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t] += 3.0
    after = attn(q2, k2, v2)[0]
    torch.testing.assert_close(after[:, :, :t], before[:, :, :t], rtol=0, atol=1e-12)
    assert (after[:, :, t] - before[:, :, t]).abs().max() > 1e-6  # the change is seen at t


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cuts", [(L,), (2 * L, 3 * L + 1), (1, 2, 5 * L)])
def test_streaming_equals_one_forward(name: str, cuts: tuple[int, ...]) -> None:
    attn = backend(name)
    q, k, v = inputs()
    full = attn(q, k, v)[0]
    state, parts, start = None, [], 0
    for end in (*cuts, T):
        out, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        parts.append(out)
        start = end
    torch.testing.assert_close(torch.cat(parts, dim=2), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("t", [L, 3 * L + 2])
def test_state_round_trip_and_size(name: str, t: int) -> None:
    attn = backend(name)
    q, k, v = inputs()
    _, state, _ = attn(q[:, :, :t], k[:, :, :t], v[:, :, :t])
    copy = state.map(torch.clone)
    rest = (q[:, :, t:], k[:, :, t:], v[:, :, t:])
    torch.testing.assert_close(attn(*rest, copy)[0], attn(*rest, state)[0], rtol=0, atol=0)
    assert elements(state) == B * attn.state_floats(t)
    assert isinstance(state, State) and state.position == t  # a typed state that knows its position
    assert not any(x.requires_grad for x in state.tensors())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("t", [1, L + 1, 2 * L, 3 * L + 2])
def test_a_state_at_its_equivalent_position_continues_as_where_it_is(name: str, t: int) -> None:
    """:meth:`~tvq_exp.attention.base.AttentionBackend.equivalent_position`: the state moved there gives the same
    outputs, and the next state moved by as much, for a continuation of one position and one of several blocks."""
    attn = backend(name)
    q, k, v = inputs()
    _, state, _ = attn(q[:, :, :t], k[:, :, :t], v[:, :, :t])
    equivalent = attn.equivalent_position(t)
    assert 0 <= equivalent <= t
    for t_new in (1, 2 * L + 1):
        rest = (q[:, :, t : t + t_new], k[:, :, t : t + t_new], v[:, :, t : t + t_new])
        out, after, _ = attn(*rest, state)
        moved_out, moved_after, _ = attn(*rest, state.moved(equivalent - t))
        assert torch.equal(moved_out, out)
        assert moved_after.moved(t - equivalent) == after


@pytest.mark.parametrize("name", NAMES)
def test_a_states_dtypes_do_not_depend_on_the_call_that_made_it(name: str) -> None:
    """fp32: the states after one position (nothing absorbed, no cache yet), after two blocks and a half, and at the
    end hold tensors of the same dtypes, one for one: a compiled step guards on them and compiles again where one
    changes."""
    attn = backend(name).float()
    q, k, v = (x.float() for x in inputs())
    state, dtypes = None, []
    for start, end in ((0, 1), (1, 2 * L + 2), (2 * L + 2, T)):
        _, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        dtypes.append([x.dtype for x in state.tensors()])
    assert dtypes[0] == dtypes[1] == dtypes[2]


# keys quantised with a straight-through estimator: their gradient is by design not the derivative
STRAIGHT_THROUGH_KEYS = {"vq", "ovq"}


@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_finite_differences(name: str) -> None:
    """The gradient to q and v (and to k, unless the backend quantises keys straight-through) is the derivative of
    what the backend computes, by central differences in fp64 (``gradcheck``); the parameters' are finite."""
    attn = backend(name).train()
    q, k, v = (x[:1].clone().requires_grad_(True) for x in inputs())
    exact_k = name not in STRAIGHT_THROUGH_KEYS
    wrt = (q, v, k) if exact_k else (q, v)
    fn = (lambda q, v, k: attn(q, k, v)[0]) if exact_k else (lambda q, v: attn(q, k.detach(), v)[0])
    assert torch.autograd.gradcheck(fn, wrt, eps=1e-6, atol=1e-7, rtol=1e-5)
    attn(q, k, v)[0].square().sum().backward()
    assert k.grad is not None and bool(k.grad.isfinite().all()) and k.grad.abs().sum() > 0
    assert all(bool(p.grad.isfinite().all()) for p in attn.parameters() if p.grad is not None)


def test_vq_without_its_cache_carries_no_cache() -> None:
    """``use_cache=false`` (the cache ablation): the state is the window alone, and its size says so."""
    attn = build("vq", d_k=D_K, d_v=D_V, heads=H, use_cache=False, **small_options("vq", L)).double().eval()
    q, k, v = inputs()
    _, state, _ = attn(q, k, v)
    assert state.cache_n is None and elements(state) == B * attn.state_floats(T)
    assert attn.state_floats(T) < backend("vq").state_floats(T)


@pytest.mark.parametrize("name", NAMES)
def test_the_declared_capabilities_hold(name: str) -> None:
    """What a backend's class declares (encoder form, talking heads, the XL bias) is what building it allows: each
    either builds and runs, or is refused with an :class:`OptionError` naming the option."""
    cls, options = BACKENDS[name], small_options(name, L, position_bias=False)
    q, k, v = inputs()

    def make(**extra: Any) -> AttentionBackend:
        return build(name, d_k=D_K, d_v=D_V, heads=H, **options, **extra).double()

    for capable, extra, check in [
        (cls.supports_encoder, {"causal": False}, lambda a: a(q, k, v)[0].shape == (B, H, T, D_V)),
        (cls.supports_talking_heads, {"talking_heads": True}, lambda a: a(q, k, v)[0].isfinite().all()),
        (cls.supports_position_bias, {"window_bias": True}, lambda a: a.bias is not None),
        (cls.has_codebook, {}, lambda a: hasattr(a, "quantizer")),
    ]:
        if capable:
            assert check(make(**extra)), (name, extra)
        elif extra:
            with pytest.raises(OptionError):
                make(**extra)
