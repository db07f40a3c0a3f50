"""Option bounds at their ends: each kind of interval accepts and refuses exactly its end points, and a
non-finite value is refused by every bound, through a real :func:`~tvq_exp.options.checked` constructor."""

from __future__ import annotations

import math
from typing import Annotated

import pytest

from tvq_exp.options import Between, NonNegativeInt, OptionError, PositiveFloat, PositiveInt, checked


class Options:
    @checked
    def __init__(
        self,
        open_: Annotated[float, Between(0, 1, "()")] = 0.5,
        closed: Annotated[float, Between(0, 1, "[]")] = 0.5,
        low_closed: Annotated[float, Between(0, 1, "[)")] = 0.5,
        high_closed: Annotated[float, Between(0, 1, "(]")] = 0.5,
        size: PositiveInt = 1,
        count: NonNegativeInt = 0,
        rate: PositiveFloat = 1.0,
    ) -> None:
        self.values = (open_, closed, low_closed, high_closed, size, count, rate)


ACCEPTED = {
    "open_": [1e-9, 1 - 1e-9],
    "closed": [0, 1],
    "low_closed": [0, 1 - 1e-9],
    "high_closed": [1e-9, 1],
    "size": [1],
    "count": [0],
    "rate": [1e-12],
}
REFUSED = {
    "open_": [0, 1],
    "closed": [-1e-9, 1 + 1e-9],
    "low_closed": [-1e-9, 1],
    "high_closed": [0, 1 + 1e-9],
    "size": [0],
    "count": [-1],
    "rate": [0.0],
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_each_bound_accepts_its_closed_ends_and_refuses_its_open_ones(name: str) -> None:
    for value in ACCEPTED[name]:
        Options(**{name: value})
    for value in REFUSED[name]:
        with pytest.raises(OptionError, match=rf"Options: {name}={value!r}: must be"):
            Options(**{name: value})


@pytest.mark.parametrize("name", ["open_", "closed", "size", "rate"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_is_refused_by_every_bound(name: str, value: float) -> None:
    with pytest.raises(OptionError, match=r"and finite \(not inf or nan\)"):
        Options(**{name: value})
