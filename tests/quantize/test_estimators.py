"""Gradient estimators: straight-through, and the rotation trick against a rotation built by hand."""

from __future__ import annotations

import torch

from tests.helpers.ops import OpLog
from tvq_exp.quantize import VectorQuantizer, rotation_trick, straight_through


def planar_rotation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The ``(d, d)`` rotation in the plane of ``a`` and ``b`` turning ``a/||a||`` onto ``b/||b||`` (identity on
    the orthogonal complement), built from an orthonormal basis ``u1, u2`` of that plane."""
    u1 = a / a.norm()
    b_unit = b / b.norm()
    cos = b_unit @ u1
    w = b_unit - cos * u1
    sin = w.norm()
    u2 = w / sin
    eye = torch.eye(a.shape[0], dtype=a.dtype)
    return (
        eye
        + sin * (torch.outer(u2, u1) - torch.outer(u1, u2))
        + (cos - 1) * (torch.outer(u1, u1) + torch.outer(u2, u2))
    )


def test_rotation_trick_value_is_the_code_and_its_gradient_is_the_scaled_transposed_rotation() -> None:
    torch.manual_seed(0)
    k = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    c = torch.randn(5, 4, dtype=torch.float64)
    out = rotation_trick(k, c)
    assert torch.equal(out, c)
    g = torch.randn(5, 4, dtype=torch.float64)
    (grad,) = torch.autograd.grad((out * g).sum(), k)
    for i in range(5):
        rot = planar_rotation(k[i].detach(), c[i])
        assert torch.allclose(rot @ (k[i].detach() / k[i].norm()), c[i] / c[i].norm(), atol=1e-12)
        assert torch.allclose(rot @ rot.T, torch.eye(4, dtype=torch.float64), atol=1e-12)
        scale = c[i].norm() / k[i].detach().norm()
        assert torch.allclose(scale * rot @ k[i].detach(), c[i], atol=1e-12)  # the paper's q̃ = sg(λR)·e = q
        assert torch.allclose(grad[i], scale * rot.T @ g[i], atol=1e-12)


def test_straight_through_passes_the_gradient_unchanged() -> None:
    k = torch.randn(3, 4, requires_grad=True)
    c = torch.randn(3, 4)
    out = straight_through(k, c)
    g = torch.randn(3, 4)
    (grad,) = torch.autograd.grad((out * g).sum(), k)
    assert torch.equal(out, c) and torch.equal(grad, g)


def test_straight_through_computes_nothing_forward_or_backward() -> None:
    k = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    c, g = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, 32, dtype=torch.bfloat16)
    with OpLog() as log:
        out = straight_through(k, c)
        (grad,) = torch.autograd.grad(out, k, g)
    assert log.ops and not log.launches(), log.ops  # views only: no key-sized write, forward or backward
    assert torch.equal(out, c) and torch.equal(grad, g) and out.requires_grad


def test_quantiser_with_the_rotation_estimator() -> None:
    torch.manual_seed(1)
    vq = VectorQuantizer(2, 8, 3, estimator="rotation").double()
    k = torch.randn(2, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    k_hat, codes, _ = vq(k)
    codes_ref = torch.cdist(k.detach().transpose(0, 1).reshape(2, -1, 3), vq.codebook).argmin(-1)
    assert torch.equal(codes.transpose(0, 1).reshape(2, -1), codes_ref)
    assert torch.equal(k_hat, torch.stack([vq.codebook[h][codes[:, h]] for h in range(2)], 1))
    g = torch.randn_like(k)
    (grad,) = torch.autograd.grad((k_hat * g).sum(), k)
    b, h, t = 1, 0, 3
    c = vq.codebook[h, codes[b, h, t]]
    rot = planar_rotation(k[b, h, t].detach(), c)
    expected = c.norm() / k[b, h, t].detach().norm() * rot.T @ g[b, h, t]
    assert torch.allclose(grad[b, h, t], expected, atol=1e-12)


def test_rotation_trick_in_bf16_returns_the_code_exactly_and_a_float32_gradient() -> None:
    torch.manual_seed(2)
    k = torch.randn(6, 8).bfloat16().requires_grad_(True)
    c = torch.randn(6, 8).bfloat16()
    out = rotation_trick(k, c)
    assert out.dtype == torch.bfloat16 and torch.equal(out, c)
    g = torch.randn(6, 8)
    (grad,) = torch.autograd.grad((out.float() * g).sum(), k)
    kf = k.detach().float().requires_grad_(True)
    (want,) = torch.autograd.grad((rotation_trick(kf, c.float()) * g).sum(), kf)
    assert torch.allclose(grad.float(), want, rtol=2e-2, atol=2e-2)
