"""The update rules against hand computations: EMA with a decay warm-up, the gradient rule's codebook-loss
gradient, the affine (SimVQ) codes and their gradient, cosine search and read-out, k-means init per rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tvq_exp.quantize import VectorQuantizer, kmeans


def test_ema_with_decay_warmup_follows_the_hand_recurrence() -> None:
    """decay_t = start + (decay - start)·min(1, t / warmup) at optimiser step t (from 0)."""
    torch.manual_seed(0)
    vq = VectorQuantizer(1, 4, 2, decay=0.9, decay_start=0.5, decay_warmup=3)
    count, total = torch.ones(1, 4, dtype=torch.float64), vq.codebook.double().clone()
    for step in range(5):
        decay = 0.5 + 0.4 * min(1.0, step / 3)
        assert vq.current_decay() == pytest.approx(decay)
        k = torch.randn(2, 1, 16, 2)
        _, codes, _ = vq(k)
        onehot = F.one_hot(codes.reshape(-1), 4).double()
        count = decay * count + (1 - decay) * onehot.sum(0)
        total = decay * total + (1 - decay) * (onehot.T @ k.reshape(-1, 2).double())
        vq.update()
    assert int(vq.steps) == 5
    assert torch.allclose(vq.ema_count.double(), count, atol=1e-6)
    assert torch.allclose(vq.codebook.double(), total / count.clamp_min(0.01)[..., None], atol=1e-5)


def _code_gradient(
    codebook: torch.Tensor, k: torch.Tensor, codes: torch.Tensor, weight: float
) -> torch.Tensor:
    """d/dC of ``weight · mean_{b,h,t,i} (C[z] - k)²`` by hand: ``2w/(B·H·T·d) · Σ_{z = s} (C_s - k)`` per head."""
    b, h, t, d = k.shape
    grad = torch.zeros_like(codebook)
    for head in range(h):
        for key, s in zip(k[:, head].reshape(-1, d), codes[:, head].reshape(-1), strict=True):
            grad[head, s] += 2 * weight / (b * h * t * d) * (codebook[head, s] - key)
    return grad


def test_gradient_rule_codebook_loss_gradient_by_hand() -> None:
    torch.manual_seed(1)
    vq = VectorQuantizer(2, 5, 3, update="gradient", codebook_weight=0.7).double()
    k = torch.randn(2, 2, 6, 3, dtype=torch.float64)
    _, codes, aux = vq(k)
    (grad,) = torch.autograd.grad(aux["codebook_loss"], vq.embed)
    assert torch.allclose(grad, _code_gradient(vq.embed.detach(), k, codes, 0.7), atol=1e-12)


def test_affine_codes_are_basis_times_map_and_the_map_gets_the_hand_gradient() -> None:
    torch.manual_seed(2)
    vq = VectorQuantizer(2, 5, 3, update="affine").double()
    assert [name for name, _ in vq.named_parameters()] == ["proj"] and not vq.basis.requires_grad
    assert torch.equal(vq.codebook, vq.basis)  # proj starts at the identity
    with torch.no_grad():
        vq.proj.add_(0.3 * torch.randn_like(vq.proj))
    assert torch.allclose(vq.codebook, torch.einsum("hsi,hij->hsj", vq.basis, vq.proj), atol=1e-12)
    k = torch.randn(2, 2, 6, 3, dtype=torch.float64)
    _, codes, aux = vq(k)
    (grad,) = torch.autograd.grad(aux["codebook_loss"], vq.proj)
    by_hand = vq.basis.transpose(1, 2) @ _code_gradient(vq.codebook.detach(), k, codes, 1.0)
    assert torch.allclose(grad, by_hand, atol=1e-12)


def test_cosine_codebook_searches_and_reads_out_on_the_unit_sphere() -> None:
    torch.manual_seed(3)
    vq = VectorQuantizer(1, 6, 4, normalize=True).double()
    with torch.no_grad():
        vq.embed.mul_(torch.rand(1, 6, 1, dtype=torch.float64) * 10)  # code norms must not matter
    k = torch.randn(2, 1, 9, 4, dtype=torch.float64, requires_grad=True)
    k_hat, codes, _ = vq(k)
    unit = vq.embed / vq.embed.norm(dim=-1, keepdim=True)
    assert torch.allclose(vq.codebook, unit, atol=1e-12)
    assert torch.equal(codes, (k.detach() @ unit[0].T)[:, 0].argmax(-1)[:, None])  # the largest cosine
    assert torch.allclose(k_hat, unit[0][codes], atol=1e-12)
    assert torch.allclose(vq.search_keys(k), k / k.norm(dim=-1, keepdim=True), atol=1e-12)
    g = torch.randn_like(k)
    (grad,) = torch.autograd.grad((k_hat * g).sum(), k)
    n = k.detach().norm(dim=-1, keepdim=True)
    u = k.detach() / n
    assert torch.allclose(grad, (g - u * (u * g).sum(-1, keepdim=True)) / n, atol=1e-12)  # through k/||k||


def test_cosine_ema_averages_unit_keys() -> None:
    vq = VectorQuantizer(1, 2, 2, normalize=True, decay=0.5)
    vq.ema_sum.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))
    vq.embed.copy_(vq.ema_sum)
    k = torch.tensor([[3.0, 0.5], [4.0, -0.5], [0.1, 7.0]]).view(1, 1, 3, 2)
    vq(k)
    vq.update()
    unit = F.normalize(k[0, 0], dim=-1)
    total = 0.5 * vq.ema_sum.new_tensor([[1.0, 0.0], [0.0, 1.0]]) + 0.5 * torch.stack(
        [unit[:2].sum(0), unit[2]]
    )
    count = 0.5 + 0.5 * torch.tensor([2.0, 1.0])
    assert torch.allclose(vq.ema_sum[0], total, atol=1e-6)
    assert torch.allclose(vq.codebook[0], F.normalize(total / count[:, None], dim=-1), atol=1e-6)


@pytest.mark.parametrize("update", ["ema", "gradient", "affine"])
@pytest.mark.parametrize("normalize", [False, True])
def test_kmeans_init_sets_every_rule_to_the_centroids(update: str, normalize: bool) -> None:
    torch.manual_seed(4)
    vq = VectorQuantizer(2, 4, 3, update=update, init="kmeans", kmeans_iters=5, normalize=normalize)
    if update == "affine":
        with torch.no_grad():
            vq.proj.add_(0.2 * torch.randn_like(vq.proj))
    k = torch.randn(3, 2, 40, 3)
    assert not bool(vq.initialized)
    torch.manual_seed(9)
    vq(k)
    torch.manual_seed(9)
    flat = vq.search_keys(k).transpose(0, 1).reshape(2, -1, 3)
    centroids = kmeans(flat, 4, 5)
    assert bool(vq.initialized) and bool((vq.ema_count == 1).all())
    assert torch.allclose(vq.codebook, F.normalize(centroids, dim=-1) if normalize else centroids, atol=1e-5)
