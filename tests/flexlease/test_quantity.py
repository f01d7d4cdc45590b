"""Kubernetes quantities (flexlease.api.quantity): the API server's grammar, exactly."""

from __future__ import annotations

import contextlib
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexlease.api.quantity import LIMIT, QuantityError, integer_quantity, parse_quantity

# Accepted by k8s.io/apimachinery resource.ParseQuantity (after JSON's TrimSpace), with values.
ACCEPTED = [
    ("0", 0),
    ("2", 2),
    ("2k", 2000),
    ("1000m", 1),
    ("1500m", Fraction(3, 2)),
    ("+1", 1),  # <sign> ::= "+" | "-": the grammar takes a plus sign
    ("-1", -1),
    ("1.", 1),
    (".5", Fraction(1, 2)),
    ("1.5Gi", 3 * 2**29),
    ("1Ki", 1024),
    ("1Ei", 2**60),
    ("1E", 10**18),  # the decimalSI suffix E (exa), not an exponent
    ("1e3", 1000),
    ("1E3", 1000),
    ("1e+3", 1000),
    ("1e-3", Fraction(1, 1000)),
    ("5n", Fraction(5, 10**9)),
    ("1u", Fraction(1, 10**6)),
    ("1e-12", Fraction(1, 10**9)),  # rounded up to one nano unit, as Go does
    ("0.0000000001", Fraction(1, 10**9)),
    (" 4 ", 4),
    ("007", 7),
    ("1e999999999", LIMIT),  # clamped: more than exists
    ("9" * 30, LIMIT),
]
# Refused by the API server.
REFUSED = [
    "",
    " ",
    "1_000",
    "１",  # full-width digit one
    "١",  # Arabic-Indic digit one
    "1K",
    "1mi",
    "1ki",
    "1e",
    "1e3.5",
    "1.2.3",
    "NaN",
    "Infinity",
    "inf",
    "0x10",
    "1 k",
    "--1",
    "1Ki5",
    "1e9223372036854775808",  # exponent beyond int64 (strconv.ParseInt fails)
    "1e" + "9" * 5000,
]


@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_forms_the_api_server_accepts(text: str, value: int | Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", REFUSED)
def test_forms_the_api_server_refuses(text: str) -> None:
    with pytest.raises(QuantityError, match=r"not a quantity|exponent out of range"):
        parse_quantity(text)


def test_json_numbers_are_quantities_too() -> None:
    assert parse_quantity(2) == 2
    assert parse_quantity(2.0) == 2
    assert parse_quantity(Decimal("1E+3")) == 1000
    assert parse_quantity(10**40) == LIMIT
    for bad in (True, None, [], float("inf"), float("nan")):
        with pytest.raises(QuantityError):
            parse_quantity(bad)  # type: ignore[arg-type]


def test_integer_resources_must_be_whole_and_non_negative() -> None:
    assert integer_quantity("2k") == 2000
    assert integer_quantity("1000m") == 1
    with pytest.raises(QuantityError, match="whole number"):
        integer_quantity("1500m")
    with pytest.raises(QuantityError, match="negative"):
        integer_quantity("-1")


def test_error_messages_stay_short() -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity("x" * 10_000)
    assert len(str(info.value)) < 200


@given(
    st.integers(0, 10**15),
    st.sampled_from(["", "k", "M", "G", "m", "Ki", "Mi", "e3", "e-2"]),
)
def test_value_matches_the_suffix_arithmetic(n: int, suffix: str) -> None:
    scale = {
        "": Fraction(1),
        "k": Fraction(10**3),
        "M": Fraction(10**6),
        "G": Fraction(10**9),
        "m": Fraction(1, 10**3),
        "Ki": Fraction(2**10),
        "Mi": Fraction(2**20),
        "e3": Fraction(10**3),
        "e-2": Fraction(1, 100),
    }[suffix]
    want = min(n * scale, Fraction(LIMIT))
    assert parse_quantity(f"{n}{suffix}") == want


@given(st.text(max_size=12))
def test_any_text_parses_or_raises_quantity_error(text: str) -> None:
    with contextlib.suppress(QuantityError):
        parse_quantity(text)
