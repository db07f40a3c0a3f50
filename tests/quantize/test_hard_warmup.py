"""The quantiser's soft-to-hard schedule (``hard_warmup``): the value of ``k_hat`` moves linearly from the key to its
code over the first ``hard_warmup`` optimiser steps, with the straight-through gradient; evaluation reads the code."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.quantize.codebook import VectorQuantizer


def test_the_value_moves_from_the_key_to_the_code_with_the_steps() -> None:
    torch.manual_seed(0)
    vq = VectorQuantizer(2, 5, 3, hard_warmup=4).double().train()
    k = torch.randn(2, 2, 7, 3, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        code = vq.eval()(k)[0]
    vq.train()
    for step, alpha in [(0, 0.0), (1, 0.25), (3, 0.75), (4, 1.0), (9, 1.0)]:
        vq.steps.fill_(step)
        k_hat = vq(k)[0]
        assert torch.allclose(k_hat, alpha * code + (1 - alpha) * k, atol=1e-12)
        g = torch.randn_like(k_hat)
        assert torch.equal(torch.autograd.grad((k_hat * g).sum(), k)[0], g)  # straight-through
        vq.discard_pending()


def test_the_steps_count_optimiser_steps_and_evaluation_reads_the_code() -> None:
    torch.manual_seed(1)
    vq = VectorQuantizer(1, 4, 2, hard_warmup=2).train()
    k = torch.randn(1, 1, 6, 2)
    for _ in range(3):
        vq(k)
        vq.update()
    assert int(vq.steps) == 3 and float(vq.hard_fraction()) == 1.0
    vq.steps.zero_()
    k_hat, codes, _ = vq.eval()(k)
    assert torch.equal(k_hat, vq.codebook[0, codes[0, 0]][None, None])
    assert torch.allclose(vq.train()(k)[0], k, atol=1e-6, rtol=0)  # step 0 of the warm-up: the key itself
    # a training-mode forward without gradients follows evaluation's rule, as sampled codes do
    with torch.no_grad():
        assert torch.equal(vq(k)[0], k_hat)


def test_a_delay_reads_the_key_itself_first() -> None:
    torch.manual_seed(2)
    vq = VectorQuantizer(1, 4, 2, hard_warmup=4, hard_warmup_delay=3).double().train()
    k = torch.randn(1, 1, 5, 2, dtype=torch.float64)
    code = vq.eval()(k)[0]
    vq.train()
    for step, alpha in [(0, 0.0), (3, 0.0), (4, 0.25), (6, 0.75), (7, 1.0), (20, 1.0)]:
        vq.steps.fill_(step)
        assert torch.allclose(vq(k)[0], alpha * code + (1 - alpha) * k, atol=1e-12), step
        vq.discard_pending()


def test_a_delay_without_a_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="hard_warmup_delay"):
        VectorQuantizer(1, 4, 2, hard_warmup_delay=3)
