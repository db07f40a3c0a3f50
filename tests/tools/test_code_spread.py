"""``tools/vq_cache_learning/code_spread.py``: its measures of the codes at MQAR's value positions against hand
computations."""

from __future__ import annotations

import math

import pytest
import torch

from tools.vq_cache_learning.code_spread import (
    cell,
    entropy_given,
    independent_shared_share,
    perplexity,
    shared_share,
)


def test_perplexity_counts_the_codes_in_use_by_their_share() -> None:
    assert perplexity(torch.tensor([3, 3, 3, 3])) == pytest.approx(1.0)
    assert perplexity(torch.tensor([[0, 1], [2, 3]])) == pytest.approx(4.0)
    # shares 1/2, 1/4, 1/4: entropy 1.5 ln 2
    assert perplexity(torch.tensor([5, 5, 1, 9])) == pytest.approx(2**1.5)


def test_entropy_given_the_token_is_zero_for_a_function_of_it_and_its_share_weighted_entropy_else() -> None:
    tokens = torch.tensor([1, 1, 2, 2, 3, 3])
    assert entropy_given(torch.tensor([7, 7, 4, 4, 7, 7]), tokens) == pytest.approx(0.0)
    # token 1 splits over two codes (ln 2), tokens 2 and 3 do not: (2/6) ln 2
    assert entropy_given(torch.tensor([0, 1, 4, 4, 5, 5]), tokens) == pytest.approx(math.log(2) / 3)


def test_shared_share_counts_each_entry_whose_code_another_of_its_row_has() -> None:
    codes = torch.tensor([[0, 1, 2, 0], [5, 5, 5, 6]])  # row 0: two of four share; row 1: three of four
    assert shared_share(codes) == pytest.approx(5 / 8)
    assert shared_share(torch.tensor([[0, 1, 2, 3]])) == 0.0


def test_independent_draws_give_the_birthday_bound() -> None:
    uniform = torch.arange(64).repeat(2)  # 64 codes, equally used
    assert independent_shared_share(uniform, 8) == pytest.approx(1 - (63 / 64) ** 7)
    assert independent_shared_share(torch.tensor([4, 4, 4]), 8) == pytest.approx(1.0)
    # against a sampled estimate: p = (1/2, 1/4, 1/4), pairs of 2: 1 - sum p (1 - p) = sum p^2 = 3/8
    assert independent_shared_share(torch.tensor([0, 0, 1, 2]), 2) == pytest.approx(3 / 8)
    draws = torch.multinomial(
        torch.tensor([0.5, 0.25, 0.25]),
        2 * 20000,
        replacement=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert shared_share(draws.view(-1, 2)) == pytest.approx(3 / 8, abs=0.01)


def test_the_table_cells_round_perplexities_to_a_tenth_and_shares_to_a_thousandth() -> None:
    found = {"value_perplexity": 18.94, "shared": 0.29812}
    assert cell(found, "value positions' code perplexity") == "18.9"
    assert cell(found, "value codes shared: measured") == "0.298"
