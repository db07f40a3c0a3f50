"""Dense attention's ``scaled_dot_product_attention`` path with a carried state (no XL bias: the path that masks
with :func:`tvq_exp.attention.base.causal_mask` at an offset) against the plain masked-softmax reference over the
whole sequence, forward and the queries' gradients: a mask that lets a query see one key ahead (``j <= i + 1``) fails it."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.attention import build_attention
from tvq_exp.attention.dense.naive import softmax_attention


@pytest.mark.parametrize(("kv_heads", "cuts"), [(2, (5,)), (1, (3, 4)), (2, (1, 6))])
def test_sdpa_path_with_a_carried_state_equals_the_reference(kv_heads: int, cuts: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    attn = build_attention("dense", d_k=5, d_v=3, heads=2, kv_heads=kv_heads).double()
    t = 12
    q = torch.randn(2, 2, t, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, kv_heads, t, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, kv_heads, t, 3, dtype=torch.float64, requires_grad=True)
    bounds = [0, *cuts, t]
    state, pieces = None, []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        out, state, _ = attn(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], state)
        pieces.append(out)
    got = torch.cat(pieces, dim=2)
    ref = softmax_attention(q, k, v)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    g = torch.randn_like(
        ref
    )  # the carried keys and values are detached (TBPTT): compare the queries' gradient
    (grad,) = torch.autograd.grad((got * g).sum(), (q,))
    (ref_grad,) = torch.autograd.grad((ref * g).sum(), (q,))
    torch.testing.assert_close(grad, ref_grad, atol=1e-10, rtol=0)
