"""Dead-code re-seeding relative to a code's fair share of the step's keys: it fires exactly for the codes under
the fraction, re-seeds them from the step's keys, never at step 1 of a healthy codebook, at once when a code
loses its keys (not after the usage EMA decays), and revives a collapsed codebook."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.quantize import VectorQuantizer, dead_codes


def _far_apart(vq: VectorQuantizer) -> torch.Tensor:
    """Give the codes of a one-head quantiser the positions ``10·e_s`` (s < d) and ``-10·e_(s-d)``; return them."""
    s, d = vq.codebook_size, vq.dim
    codes = torch.cat([10 * torch.eye(d), -10 * torch.eye(d)])[:s][None]
    vq.rule.assign(vq, torch.ones(1, s, dtype=torch.bool), codes)
    return codes


def test_dead_codes_compares_counts_with_the_fair_share() -> None:
    counts = torch.tensor([[8.0, 4.0, 2.0, 1.0, 1.0]])  # 16 keys: fair share 3.2
    assert dead_codes(counts, 0.5).tolist() == [[False, False, False, True, True]]  # < 1.6
    assert dead_codes(counts, 0.7).tolist() == [[False, False, True, True, True]]  # < 2.24
    assert not dead_codes(counts, 0.0).any()
    # "fewer than the fraction": a code with exactly its threshold (0.25 · 4 = 1 of 16 keys) lives
    exact = torch.tensor([[9.0, 4.0, 2.0, 1.0]])
    assert dead_codes(exact, 0.25).tolist() == [[False, False, False, False]]
    assert dead_codes(exact, 0.2501).tolist() == [[False, False, False, True]]


@pytest.mark.parametrize("update", ["ema", "gradient", "affine"])
def test_reseed_fires_exactly_under_the_fraction_and_draws_from_the_step_keys(update: str) -> None:
    torch.manual_seed(0)
    vq = VectorQuantizer(1, 8, 4, update=update, decay=0.5, reseed_fraction=0.3)
    codes = _far_apart(vq)
    uses = torch.tensor([40, 20, 3, 1])  # codes 4..7 get no key
    keys = torch.cat([codes[0, s] + 0.1 * torch.randn(int(n), 4) for s, n in enumerate(uses)]).view(
        1, 1, -1, 4
    )
    _, z, _ = vq(keys)
    assert torch.equal(z.view(-1).bincount(minlength=8)[:4], uses)
    before = vq.codebook.detach().clone()
    vq.update()
    step = torch.tensor([40.0, 20, 3, 1, 0, 0, 0, 0])  # 64 keys: fair share 8
    dead = step < 0.3 * 8  # codes 3..7 (under 2.4); code 2 (3 keys) lives
    assert dead.tolist() == [False, False, False, True, True, True, True, True]
    counts = 0.5 + 0.5 * step  # the usage EMA; the re-seeded codes get its mean
    fair = counts.mean()
    assert torch.allclose(vq.ema_count[0], torch.where(dead, fair, counts))
    after = vq.codebook.detach()[0]
    if update != "ema":  # the EMA moves the live codes too
        assert torch.allclose(after[~dead], before[0][~dead], atol=1e-5)
    step_keys = keys[0, 0]
    for s in dead.nonzero().view(-1):
        assert (step_keys - after[s]).norm(dim=-1).min() < 1e-5  # re-seeded from a key of the step
    assert (
        torch.cdist(after[dead], after[dead]).add(torch.eye(int(dead.sum())) * 1e9).min() > 0
    )  # distinct keys
    if update == "ema":
        assert torch.allclose(vq.ema_sum[0, dead], after[dead] * fair, atol=1e-4)


def test_no_reseed_at_step_one_when_every_code_gets_its_share() -> None:
    """The old absolute threshold fired for every code at step 1 (counts start at 1); the relative one
    leaves a uniformly used codebook alone even at a high fraction."""
    torch.manual_seed(1)
    vq = VectorQuantizer(1, 8, 4, reseed_fraction=0.9)
    codes = _far_apart(vq)
    keys = codes[0].repeat(30, 1).view(1, 1, -1, 4)
    vq(keys)
    vq.update()
    assert torch.allclose(vq.codebook, codes, atol=1e-5)


def test_a_code_that_loses_its_keys_is_reseeded_at_the_next_step() -> None:
    """Its usage EMA (decay 0.99) is still far above the fraction; what counts is the step's share."""
    torch.manual_seed(2)
    vq = VectorQuantizer(1, 4, 4, decay=0.99, reseed_fraction=0.1)
    codes = _far_apart(vq)
    for _ in range(20):  # every code busy
        vq(codes[0].repeat(10, 1).view(1, 1, -1, 4))
        vq.update()
    keys = codes[0, :3].repeat(10, 1).view(1, 1, -1, 4) + 0.01 * torch.randn(
        1, 1, 30, 4
    )  # code 3 loses its keys
    usage = 0.99 * vq.ema_count + 0.01 * torch.tensor([[10.0, 10, 10, 0]])  # the usage EMA after this step
    assert not dead_codes(usage, 0.1).any()  # an EMA test would not notice for ~230 steps ...
    vq(keys)
    vq.update()
    assert (keys[0, 0] - vq.codebook[0, 3]).norm(dim=-1).min() < 1e-5  # ... the re-seeding has
    assert torch.allclose(vq.codebook[0, :3], codes[0, :3], atol=0.01)


def test_reseeding_revives_a_collapsed_codebook_and_without_it_nothing_moves() -> None:
    def perplexity_after(fraction: float) -> float:
        torch.manual_seed(0)
        vq = VectorQuantizer(1, 16, 4, decay=0.8, reseed_fraction=fraction)
        collapsed = torch.full((1, 16, 4), 50.0)
        collapsed[0, 0] = 0.0
        vq.rule.assign(vq, torch.ones(1, 16, dtype=torch.bool), collapsed)
        k = torch.randn(8, 1, 64, 4)
        assert float(vq(k)[2]["perplexity"]) == pytest.approx(1.0)
        for _ in range(10):
            vq(k)
            vq.update()
        return float(vq(k)[2]["perplexity"])

    assert perplexity_after(0.0) == pytest.approx(1.0)
    assert perplexity_after(0.1) > 4.0
