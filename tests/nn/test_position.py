"""The Transformer-XL window bias, one-sided (decoders) and two-sided (encoders), against its formula built from
sinusoids directly (:mod:`tests.helpers.xl_bias`), never from the module's own tables."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.xl_bias import sinusoid, xl_bias_matrix
from tvq_exp.attention.dense.naive import window_bias_matrix
from tvq_exp.nn.position import XLRelativeBias, sinusoid_table

T, M = 9, 4


def _bias() -> XLRelativeBias:
    bias = XLRelativeBias(heads=2, d_k=4, max_distance=M, sinusoid_dim=6).double()
    torch.nn.init.normal_(bias.u)  # zero at init: make the query offsets matter
    torch.nn.init.normal_(bias.v)
    return bias


def _distance() -> torch.Tensor:
    return torch.arange(T)[:, None] - torch.arange(T)[None, :]


def test_sinusoid_table_is_the_formula() -> None:
    table = sinusoid_table(M + 1, 6)
    for d in range(M + 1):
        torch.testing.assert_close(table[d].double(), sinusoid(d, 6), atol=1e-7, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["one-sided", "two-sided"])
def test_window_bias_equals_the_formula(causal: bool) -> None:
    bias = _bias()
    q = torch.randn(2, 2, T, 4, dtype=torch.float64)
    expected = xl_bias_matrix(bias, q, causal)
    got = bias.bias(q, _distance()) if causal else bias.encoder_bias(q, _distance())
    # the module's sinusoid table is fp32 (relative error 2^-24 per entry): 1e-6 here; a wrong sign is O(1)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    # the plain references of dense and VQ attention build their bias with the same formula
    torch.testing.assert_close(window_bias_matrix(bias, q, causal), expected, atol=1e-6, rtol=1e-6)
    inside = _distance().abs() <= M if not causal else (_distance() >= 0) & (_distance() <= M)
    assert expected[..., inside].abs().min() > 0 and (expected[..., ~inside] == 0).all()


def test_two_sided_bias_differs_between_distances_d_and_minus_d() -> None:
    """Sine is odd: ``r_{-d} != r_d``, so a query sees a key ``d`` before it and one ``d`` after it differently."""
    bias = _bias()
    q = torch.randn(1, 2, T, 4, dtype=torch.float64)
    two = bias.encoder_bias(q, _distance())
    i = T // 2
    for d in range(1, M + 1):
        assert (two[..., i, i - d] - two[..., i, i + d]).abs().min() > 1e-3, d
