"""The compressive cache's running means at long lengths: the parallel prefix (one fp64 cumulative sum over
the blocks) against the plain block-by-block recurrence of ``naive.py``."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.attention.vq import cache
from tvq_exp.attention.vq.cache import running_code_means
from tvq_exp.attention.vq.naive import running_code_means as running_code_means_reference

# 4096 blocks of 8 positions (32k tokens), 4 codes: thousands of entries per code's prefix
BLOCKS, BLOCK, CODES, DV = 4096, 8, 4, 3


def long_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Codes, values ``1 + 0.1·noise`` (a mean far from zero: the case where sums outgrow their rounding),
    every position valid but the last block's tail, and a carried state."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, CODES, (2, BLOCKS, BLOCK), generator=gen)
    values = (1 + 0.1 * torch.randn(2, BLOCKS, BLOCK, DV, generator=gen, dtype=torch.float64)).to(dtype)
    valid = torch.ones(BLOCKS, BLOCK, dtype=torch.bool)
    valid[-1, 5:] = False
    n0 = torch.randint(1, 50, (2, CODES), generator=gen).double()
    mu0 = (1 + 0.1 * torch.randn(2, CODES, DV, generator=gen, dtype=torch.float64)).to(dtype)
    return codes, values, valid, n0, mu0


@pytest.fixture(params=[True, False], ids=["by-block", "cumsum"])
def by_block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways of taking the prefix: block by block (a CPU's default) and one cumsum (a GPU's)."""
    monkeypatch.setattr(cache, "_by_block", lambda x, choice: request.param)
    return request.param


@pytest.mark.usefixtures("by_block")
def test_parallel_prefix_equals_the_recurrence_in_fp64_at_long_length() -> None:
    codes, values, valid, n0, mu0 = long_inputs(torch.float64)
    values.requires_grad_()
    counts, means = running_code_means(codes, values, valid, n0, mu0)
    ref_counts, ref_means = running_code_means_reference(codes, values, valid, n0, mu0)
    assert torch.equal(counts, ref_counts)
    assert (means - ref_means).abs().max() < 1e-10
    g = torch.randn_like(means)
    got = torch.autograd.grad((means * g).sum(), values)[0]
    want = torch.autograd.grad((ref_means * g).sum(), values)[0]
    assert (got - want).abs().max() < 1e-10
    assert got[:, -1, 5:].abs().sum() == 0 and got.abs().sum() > 0


@pytest.mark.usefixtures("by_block")
def test_fp32_means_stay_within_their_rounding_at_long_length() -> None:
    """fp32 values: the means equal the fp64 recurrence on the same values within the rounding of the
    per-block fp32 sums and of the fp32 result. A prefix accumulated in fp32 (or Chan's update in fp32)
    drifts by ``O(√j·ε)`` beyond it."""
    codes, values, valid, n0, mu0 = long_inputs(torch.float32)
    counts, means = running_code_means(codes, values, valid, n0, mu0)
    assert means.dtype == torch.float32 and counts.dtype == torch.float64
    ref = running_code_means_reference(codes, values.double(), valid, n0, mu0.double())[1]
    # a block's fp32 sum of at most BLOCK terms is off by <= (BLOCK - 1)·u·Σ|v| and the carried state's
    # n0·μ0 by u·n0·|μ0|, so the mean by BLOCK·u times the mean of |v| (the same recurrence on |v|);
    # rounding the result adds u·|μ|; the fp64 prefix, BLOCKS·2^-53 of the mean of |v|
    u = 2.0**-24
    abs_mean = running_code_means_reference(codes, values.double().abs(), valid, n0, mu0.double().abs())[1]
    bound = u * ref.abs() + (BLOCK * u + BLOCKS * 2.0**-53) * abs_mean
    assert ((means.double() - ref).abs() <= bound).all(), ((means.double() - ref).abs() / bound).max()
