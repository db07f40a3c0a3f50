"""The training step's work outside the model, per step: the finiteness verdict and the codebook metrics' interval
sums are a few launches whatever the model's depth (on a GPU each aten op is a kernel launch, a few microseconds
of the host's time; a 48-layer model has about 400 gradients and 200 codebook metrics). Counted on CPU under a
dispatch mode, which sees every aten op the code calls (not the ones inside them). And what they compute."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.ops import OpLog
from tvq_exp.models.decoder import total_loss
from tvq_exp.models.interval_sums import IntervalSums
from tvq_exp.models.optim import all_finite


def parameters(count: int, dtype: torch.dtype = torch.float32) -> list[nn.Parameter]:
    params = [nn.Parameter(torch.randn(3, 5, dtype=dtype)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def ops_of(fn: Any) -> int:
    with OpLog() as log:
        fn()
    return len(log.launches())


def test_the_finiteness_verdict_takes_as_many_ops_for_400_gradients_as_for_4() -> None:
    loss = torch.tensor(1.0)
    few, many = parameters(4), parameters(400)
    assert ops_of(lambda: all_finite(loss, few)) == ops_of(lambda: all_finite(loss, many)) <= 5
    mixed = parameters(200) + parameters(200, torch.bfloat16)  # one check per dtype
    assert ops_of(lambda: all_finite(loss, mixed)) == ops_of(lambda: all_finite(loss, few)) + 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_verdict_finds_a_non_finite_value_in_any_gradient_and_changes_none(
    bad: float, dtype: torch.dtype
) -> None:
    params = parameters(3) + parameters(3, dtype)
    params[0].grad[0, 0] = -0.0
    params[0].grad[0, 1] = 1e-40  # a subnormal: kept as it is
    loss = torch.tensor(2.5)
    before = [p.grad.clone() for p in params]
    assert bool(all_finite(loss, params))
    for i in range(len(params)):
        for at in [(0, 0), (2, 4)]:
            kept = params[i].grad[at].clone()
            params[i].grad[at] = bad
            assert not bool(all_finite(loss, params)), (i, at)
            params[i].grad[at] = kept
    assert not bool(all_finite(torch.tensor(bad), params))
    assert bool(all_finite(loss, params))
    for p, g in zip(params, before, strict=True):
        assert torch.equal(p.grad, g) and torch.equal(p.grad.signbit(), g.signbit())


def metrics(count: int, step: int) -> dict[str, torch.Tensor]:
    return {f"layer{i}/m": torch.tensor(float(i + step)) for i in range(count)}


def test_interval_sums_add_and_drop_in_as_many_ops_for_200_metrics_as_for_2() -> None:
    def step(sums: IntervalSums, values: dict[str, torch.Tensor]) -> None:
        sums.add(values)
        sums.keep_if(finite)

    finite, two, many = torch.tensor(True), metrics(2, 1), metrics(200, 1)
    few_sums, many_sums = IntervalSums(), IntervalSums()
    step(few_sums, two), step(many_sums, many)  # the first step starts the sums
    assert ops_of(lambda: step(few_sums, two)) == ops_of(lambda: step(many_sums, many)) <= 5


def test_interval_sums_are_the_means_over_the_interval_and_a_skip_drops_it() -> None:
    sums = IntervalSums()
    assert sums.means() == {}
    sums.add({"a": torch.tensor(1.0), "b": torch.tensor(2.0, dtype=torch.bfloat16)})
    sums.add({"a": torch.tensor(3.0), "b": torch.tensor(6.0)})
    sums.keep_if(torch.tensor(True))
    assert sums.means() == {"a": 2.0, "b": 4.0}
    assert sums.means() == {}  # a new interval
    sums.add({"a": torch.tensor(5.0)})
    sums.keep_if(torch.tensor(False))  # a skipped step drops the interval so far
    sums.add({"a": torch.tensor(7.0)})
    assert sums.means() == {"a": 7.0}


def test_interval_sums_take_a_metric_that_appears_and_survive_a_checkpoint() -> None:
    sums = IntervalSums()
    sums.add({"a": torch.tensor(1.0)})
    sums.add(
        {"a": torch.tensor(3.0), "b": torch.tensor(4.0)}
    )  # b joins: its sum over the batches that had it
    again = IntervalSums()
    again.load(sums.sums(), sums.batches)
    again.add({"a": torch.tensor(2.0), "b": torch.tensor(2.0)})
    assert again.means() == {"a": 2.0, "b": 2.0}


def test_the_auxiliary_losses_sum_in_as_many_ops_for_48_layers_as_for_2() -> None:
    """The decoder's sum of its blocks' auxiliary losses: their fp32 sum, and its gradient reaches every one."""
    few = [torch.tensor(float(i), requires_grad=True) for i in range(2)]
    many = [torch.tensor(i / 7, requires_grad=True) for i in range(48)]
    assert (
        ops_of(lambda: total_loss(few, few[0].device))
        == ops_of(lambda: total_loss(many, many[0].device))
        <= 2
    )
    total = total_loss(many, many[0].device)
    assert total.dtype == torch.float32 and total.item() == pytest.approx(
        sum(i / 7 for i in range(48)), rel=1e-6
    )
    total.backward()
    assert all(loss.grad == 1 for loss in many)
    assert total_loss([], torch.device("cpu")).item() == 0.0
    assert total_loss([torch.tensor(1.5, dtype=torch.bfloat16)], torch.device("cpu")).dtype == torch.float32
