"""Stochastic code assignment against hand computations: the Boltzmann logits, the Gumbel-max draw on the same
noise, the draw's frequencies, the temperature schedule, and the statistics of the drawn codes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tvq_exp.quantize import VectorQuantizer
from tvq_exp.quantize.sampling import assignment_logits, logit_scale, sampled_code


def hand_logits(x: torch.Tensor, codebook: torch.Tensor, temperature: float) -> torch.Tensor:
    """``-||x - C_s||² / (τ·m)`` with ``m`` the head's mean squared distance to the nearest code, by loops."""
    h, n, _ = x.shape
    out = torch.empty(h, n, codebook.shape[1], dtype=torch.float64)
    for head in range(h):
        dist = torch.tensor(
            [[float(((key - code) ** 2).sum()) for code in codebook[head]] for key in x[head]]
        )
        m = float(dist.min(-1).values.mean())
        out[head] = -dist / (temperature * m)
    return out


def test_logits_are_the_boltzmann_log_probabilities_by_hand() -> None:
    torch.manual_seed(0)
    x, codebook = torch.randn(2, 7, 3), torch.randn(2, 5, 3)
    nearest = torch.cdist(x, codebook).argmin(-1)
    logits = assignment_logits(x, codebook, logit_scale(x, codebook, nearest, 0.7))
    want = hand_logits(x, codebook, 0.7)
    assert torch.allclose(logits.double().log_softmax(-1), want.log_softmax(-1), atol=1e-5)


def test_the_draw_is_the_gumbel_max_of_the_hand_logits_on_the_same_noise() -> None:
    torch.manual_seed(1)
    x, codebook = torch.randn(2, 9, 3), torch.randn(2, 6, 3)
    nearest = torch.cdist(x, codebook).argmin(-1)
    torch.manual_seed(5)
    drawn = sampled_code(x, codebook, nearest, 2.0)
    torch.manual_seed(5)
    noise = torch.empty(2, 9, 6).exponential_()
    want = (hand_logits(x, codebook, 2.0) - noise.double().log()).argmax(-1)
    assert torch.equal(drawn, want)
    assert not torch.equal(drawn, nearest)  # at τ = 2 some keys take another code


def test_the_draws_follow_the_softmax() -> None:
    """20k copies of one key: each code's frequency is within 5 standard errors of its softmax probability."""
    torch.manual_seed(2)
    codebook = torch.tensor([[[1.0, 0.0], [0.0, 1.1], [-1.2, 0.0], [0.0, -1.4]]])
    x = torch.zeros(1, 20_000, 2)
    nearest = torch.zeros(1, 20_000, dtype=torch.long)
    drawn = sampled_code(x, codebook, nearest, 1.5)
    freq = torch.bincount(drawn.reshape(-1), minlength=4).double() / 20_000
    dist = ((codebook[0] - x[0, 0]) ** 2).sum(-1).double()
    p = (-dist / (1.5 * dist.min())).softmax(-1)
    assert torch.all((freq - p).abs() < 5 * (p * (1 - p) / 20_000).sqrt())
    assert float(p.min()) > 0.1 and float(p.max()) < 0.4  # not the nearest code's alone


def test_the_temperature_anneals_to_the_nearest_code_and_evaluation_takes_the_nearest() -> None:
    torch.manual_seed(3)
    vq = VectorQuantizer(2, 8, 3, assignment="sampled", temperature=2.0, temperature_anneal=4)
    k = torch.randn(2, 2, 32, 3)
    nearest = torch.cdist(k.transpose(0, 1).reshape(2, -1, 3), vq.codebook).argmin(-1)
    nearest = nearest.view(2, 2, 32).transpose(0, 1)
    with torch.no_grad():
        assert torch.equal(vq(k)[1], nearest)  # no gradients: the nearest code
    assert torch.equal(vq.eval()(k)[1], nearest)
    vq.train()
    for step in range(6):
        assert vq.current_temperature() == pytest.approx(2.0 * max(0.0, 1 - step / 4))
        codes = vq(k)[1]
        assert torch.equal(codes, nearest) == (step >= 4)
        vq.discard_pending()
        vq.steps += 1
    assert VectorQuantizer(2, 8, 3, temperature=2.0).current_temperature() == 0.0  # nearest: no draw
    assert VectorQuantizer(2, 8, 3, assignment="sampled", temperature=0.5).current_temperature() == 0.5


def test_the_statistics_and_the_quantised_keys_are_those_of_the_drawn_codes() -> None:
    torch.manual_seed(4)
    vq = VectorQuantizer(1, 4, 2, decay=0.8, assignment="sampled", temperature=3.0)
    before = vq.codebook.double().clone()
    k = torch.randn(2, 1, 16, 2, requires_grad=True)
    k_hat, codes, _ = vq(k)
    assert torch.equal(k_hat, vq.codebook[0][codes[:, 0]][:, None])
    flat = codes.reshape(-1)
    assert not torch.equal(flat, torch.cdist(k.detach().reshape(-1, 2), vq.codebook[0]).argmin(-1))
    onehot = F.one_hot(flat, 4).double()
    assert torch.equal(vq.pending_count[0].double(), onehot.sum(0))
    vq.update()
    count = 0.8 + 0.2 * onehot.sum(0)
    total = 0.8 * before[0] + 0.2 * (onehot.T @ k.detach().reshape(-1, 2).double())
    assert torch.allclose(vq.codebook[0].double(), total / count[:, None], atol=1e-6)
    (grad,) = torch.autograd.grad((k_hat * 2).sum(), k)  # straight-through, as with the nearest code
    assert torch.equal(grad, torch.full_like(k, 2.0))


def test_bad_assignment_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="assignment"):
        VectorQuantizer(1, 4, 2, assignment="soft")
    with pytest.raises(ValueError, match="temperature"):
        VectorQuantizer(1, 4, 2, assignment="sampled", temperature=0.0)
