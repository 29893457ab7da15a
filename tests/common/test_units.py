"""The one parser of shares written as percentages (harness.common.units): a ladder's ``qps: 50%``,
a baseline's ``rel_tolerance: 10%``, ``--until-precision 10%`` all read ``10%`` the same way."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, BeforeValidator, ValidationError

from harness.common.units import fraction, parse_percent


@pytest.mark.parametrize(
    ("text", "share"),
    [("50%", 0.5), (" 2.5 % ", 0.025), ("0%", 0.0), ("-5%", -0.05), ("150%", 1.5), ("50", None), ("", None)],
)
def test_a_percentage_and_only_a_percentage(text: str, share: float | None) -> None:
    assert parse_percent(text) == (pytest.approx(share) if share is not None else None)


@pytest.mark.parametrize("text", ["x%", "%", "nan%", "inf%", "10%%"])
def test_a_percentage_that_is_no_number(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a percentage like 10%"):
        parse_percent(text)


class Tol(BaseModel):
    rel: Annotated[float, BeforeValidator(fraction)]


@pytest.mark.parametrize(
    ("value", "share"), [("10%", 0.1), ("0.1", 0.1), (" 0.25 ", 0.25), (0.3, 0.3), (1, 1.0)]
)
def test_a_fraction_field_takes_either_form(value: object, share: float) -> None:
    assert Tol.model_validate({"rel": value}).rel == pytest.approx(share)


def test_a_fraction_field_says_what_it_takes() -> None:
    with pytest.raises(ValidationError, match=r"'ten' is not a percentage like 10% or a fraction like 0\.1"):
        Tol.model_validate({"rel": "ten"})
    with pytest.raises(ValidationError, match="'x%' is not a percentage like 10%"):
        Tol.model_validate({"rel": "x%"})
