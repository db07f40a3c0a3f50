"""VQ attention treats a carried state at its :meth:`equivalent_position` as the state where it was: the same output,
gradients and next state, the next position moved by as much (what lets a compiled training step guard on one
position for all of TBPTT's later segments)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.attention.test_vq import make_vq, qkv
from tvq_exp.attention.vq import VQAttention

L = 4


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_cache": False},
        {"cache_keys": "mean"},
        {"cache_key_grad": True},
        {"grad_through_cache": False},
        {"kernel": "triton"},
    ],
    ids=["cache", "no-cache", "mean-keys", "cache-key-grad", "no-grad-through-cache", "triton"],
)
def test_a_state_moved_to_its_equivalent_position_gives_the_same_call(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefixes of every length from a block short of two to three blocks past it (positions 7 to 21, ``L = 4``),
    continued by calls shorter than a block, of one block, and of several blocks not whole (the fused kernels under
    Triton's interpreter: two of these)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    dtype = torch.float32 if "kernel" in options else torch.float64  # (the interpreter's dots take fp32)
    attn = make_vq(L, window_bias=True, window_len=L, dtype=dtype, **options).train()
    q, k, v = qkv(21 + 9, dtype=dtype, grad=False)
    interpreted = "kernel" in options  # the interpreter's calls are slow: two cases, a later position's
    for t in (10, 13) if interpreted else range(7, 22):
        _, state, _ = attn(q[:, :, :t], k[:, :, :t], v[:, :, :t])
        equivalent = attn.equivalent_position(t)
        assert equivalent == (t if t < 2 * L else 2 * L + t % L)
        for t_new in (3,) if interpreted else (1, 3, L, 9):
            chunk = [x[:, :, t : t + t_new].clone().requires_grad_() for x in (q, k, v)]
            moved_chunk = [x.detach().clone().requires_grad_() for x in chunk]
            out, after, _ = attn(*chunk, state)
            moved_out, moved_after, _ = attn(*moved_chunk, state.moved(equivalent - t))
            assert torch.equal(moved_out, out), (t, t_new)
            weights = torch.randn_like(out)
            grads = torch.autograd.grad((out * weights).sum(), chunk)
            moved_grads = torch.autograd.grad((moved_out * weights).sum(), moved_chunk)
            for name, g, moved_g in zip("qkv", grads, moved_grads, strict=True):
                assert torch.equal(moved_g, g), (t, t_new, name)
            assert after.position == t + t_new and moved_after.position == equivalent + t_new
            assert moved_after.moved(t - equivalent) == after, (t, t_new)


def test_the_state_moves_with_its_nested_states_and_keeps_its_tensors() -> None:
    attn: VQAttention = make_vq(L)
    q, k, v = qkv(11, grad=False)
    _, state, _ = attn(q, k, v)
    moved = state.moved(-4)
    assert (moved.position, state.position) == (7, 11)
    assert all(a is b for a, b in zip(moved.tensors(), state.tensors(), strict=True))
