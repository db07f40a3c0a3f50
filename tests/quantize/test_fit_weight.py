"""The codebook fitted where the loss is sensitive (``fit_weight=fisher``): each key counts in the EMA statistics
with ``||∂L/∂k_hat||²`` (scaled to mean 1), gathered in the backward pass; the forward is the uniform quantiser's."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.quantize.codebook import VectorQuantizer


def one_code_quantiser(fit_weight: str, fit_floor: float = 0.0) -> VectorQuantizer:
    """One head, two codes far apart in 2-d: every key below lies nearest code 0."""
    vq = VectorQuantizer(1, 2, 2, decay=1e-9, fit_weight=fit_weight, fit_floor=fit_floor).double().train()
    with torch.no_grad():
        vq.embed.copy_(torch.tensor([[[0.0, 0.0], [100.0, 100.0]]]))
        vq.ema_sum.copy_(vq.embed)
    return vq


@pytest.mark.parametrize(
    "fit_weight, fit_floor, expected",
    [("uniform", 0.0, [2.0, 1.0]), ("fisher", 0.0, [3.6, 0.2]), ("fisher", 0.5, [2.8, 0.6])],
)
def test_a_code_moves_to_the_gradient_weighted_mean_of_its_keys_by_hand(
    fit_weight: str, fit_floor: float, expected: list
) -> None:
    vq = one_code_quantiser(fit_weight, fit_floor)
    k = torch.tensor([[[[0.0, 2.0], [4.0, 0.0]]]], dtype=torch.float64, requires_grad=True)  # (1, 1, 2, 2)
    k_hat = vq(k)[0]
    (k_hat * torch.tensor([[[[1.0, 0.0], [0.0, 3.0]]]], dtype=torch.float64)).sum().backward()  # |g|² = 1, 9
    vq.update()
    # weights 1 and 9, scaled to mean 1: 0.2 and 1.8; code 0 = (0.2·(0, 2) + 1.8·(4, 0)) / 2 = (3.6, 0.2);
    # a floor of 0.5 mixes in the uniform weight: 0.6 and 1.4, code 0 = (2.8, 0.6)
    assert torch.allclose(vq.codebook[0, 0], torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(vq.ema_count[0], torch.tensor([2.0, 0.0], dtype=torch.float64), atol=1e-6)


def test_the_forward_is_the_uniform_quantisers_and_the_statistics_wait_for_the_backward() -> None:
    torch.manual_seed(0)
    uniform = VectorQuantizer(2, 8, 4).train()
    fisher = VectorQuantizer(2, 8, 4, fit_weight="fisher").train()
    fisher.load_state_dict(uniform.state_dict())
    k = torch.randn(3, 2, 5, 4, requires_grad=True)
    a, b = uniform(k), fisher(k)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert fisher.pending_count.sum() == 0 and fisher.pending_sum.abs().sum() == 0
    b[0].pow(2).sum().backward()
    assert fisher.pending_count.sum().item() == pytest.approx(
        2 * 15
    )  # mean weight 1 per head: N keys per head
    assert not torch.equal(fisher.pending_count, uniform.pending_count)


def test_no_gradient_no_statistics() -> None:
    vq = VectorQuantizer(1, 4, 2, fit_weight="fisher").train()
    vq(torch.randn(1, 1, 6, 2))  # keys without gradient: nothing to weight them by
    with torch.no_grad():
        vq(torch.randn(1, 1, 6, 2, requires_grad=True))
    assert vq.pending_count.sum() == 0


def test_dead_codes_are_reseeded_from_the_keys_the_loss_is_sensitive_to() -> None:
    torch.manual_seed(3)
    vq = VectorQuantizer(
        1, 4, 2, decay=1e-9, reseed_fraction=0.5, sample_keys=64, fit_weight="fisher"
    ).train()
    k = torch.randn(1, 1, 64, 2, requires_grad=True)
    grad = torch.zeros(1, 1, 64, 2)
    grad[0, 0, 17] = 1.0  # the only key the loss reads
    (vq(k)[0] * grad).sum().backward()
    vq.update()
    # key 17's code moves onto it; every other code had no weight, and is re-seeded from the one key with weight
    assert torch.allclose(vq.codebook[0], k[0, 0, 17].detach().expand(4, 2), atol=1e-5)


def test_refused_with_a_rule_whose_codes_learn_by_gradient() -> None:
    with pytest.raises(ValueError, match="fit_weight.*update='ema'"):
        VectorQuantizer(1, 4, 2, update="gradient", fit_weight="fisher")
    with pytest.raises(ValueError, match="fit_weight"):
        VectorQuantizer(1, 4, 2, fit_weight="sensitivity")
    with pytest.raises(ValueError, match="fit_floor.*fit_weight='fisher'"):
        VectorQuantizer(1, 4, 2, fit_floor=0.5)
    with pytest.raises(ValueError, match="fit_floor"):
        VectorQuantizer(1, 4, 2, fit_weight="fisher", fit_floor=1.0)


@pytest.mark.parametrize("scope", ["step", "blocks"])
def test_a_compiled_training_step_gathers_eager_fisher_statistics(scope: str) -> None:
    """Under ``torch.compile`` (the whole step, or block by block as the GPU presets do) the hook is registered
    between graphs: two training steps (the second continuing the first's state, re-seeding on) leave the
    codebook's buffers and the gradients equal to eager's, and the graph breaks only there (one per quantiser)."""
    import functools

    from torch._dynamo.utils import counters

    from tests.models.test_compile import training_step
    from tvq_exp.attention import build_attention
    from tvq_exp.models.blocks import GAUBlock
    from tvq_exp.models.decoder import Decoder, detach_state
    from tvq_exp.models.module import AutoregressiveLitModule

    def module() -> AutoregressiveLitModule:
        torch.manual_seed(0)
        codebook = {"reseed_fraction": 0.5, "fit_weight": "fisher", "fit_floor": 0.5}
        attention = functools.partial(build_attention, "vq", codebook_size=16, block_len=8, codebook=codebook)
        decoder = Decoder(256, 32, 2, functools.partial(GAUBlock, d_k=16), attention).train()
        return AutoregressiveLitModule(decoder, compile_scope=scope)

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = module(), module()
    compiled.compile_step(backend="aot_eager")
    x = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(1))
    states: list = [None, None]
    for _ in range(2):
        for i, m in enumerate((eager, compiled)):
            torch.manual_seed(2)  # the re-seeding's draws
            m.zero_grad()
            states[i] = detach_state(training_step(m, x, states[i])[1].state)
        for (name, p_e), p_c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(p_c.grad, p_e.grad, rtol=1e-5, atol=1e-6, msg=name)
        for (name, b_e), b_c in zip(eager.named_buffers(), compiled.buffers(), strict=True):
            torch.testing.assert_close(b_c, b_e, rtol=1e-5, atol=1e-6, msg=name)
    assert all(q.ema_count.sum() > 0 for q in compiled.model.quantizers())
    # the graph breaks only at the hook's registration
    reasons = {str(reason) for reason in counters["graph_break"]}
    assert reasons and all("_weigh_in_backward" in r for r in reasons), reasons
