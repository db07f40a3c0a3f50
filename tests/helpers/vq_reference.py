"""A VQ layer against its plain dense reference (``naive.vq_attention``), with the codes a sampled assignment draws
replayed: both calls made after seeding torch's generator alike."""

from __future__ import annotations

import torch
from torch import Tensor

from tvq_exp.attention.vq.naive import vq_attention as vq_reference


def assert_equals_reference(
    attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor, seed: int | None = None
) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """Assert that the layer's output and its gradients w.r.t. ``q, k, v`` equal the reference's (fp64, 1e-10);
    with ``seed``, each call draws after ``torch.manual_seed(seed)``. Returns the output, the upstream gradient
    used and the layer's input gradients."""
    if seed is not None:
        torch.manual_seed(seed)
    out, _, _ = attn(q, k, v)
    if seed is not None:
        torch.manual_seed(seed)
    ref = vq_reference(attn, q, k, v)
    assert torch.allclose(out, ref, atol=1e-10, rtol=0)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-10, rtol=0)
    return out, g, grads
