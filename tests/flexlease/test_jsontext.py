"""flexlease.jsontext: orjson's speed, json.loads's answers."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease import jsontext


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60) | st.text(alphabet='0123456789 a"', max_size=60).map(str.encode))
def test_long_digit_runs_are_found_as_the_regular_expression_finds_them(text: bytes) -> None:
    for probe in (text, text + b"1234567890123456789", b"x" + b"9" * 18 + text):
        assert jsontext.has_long_digits(probe) == (re.search(rb"[0-9]{19}", probe) is not None)


def _same(a: Any, b: Any) -> bool:
    """Equal, with types: 1 and 1.0 and True differ; NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_values_decode_as_json_loads_decodes_them(value: Any) -> None:
    """Big integers stay integers (orjson alone would give floats), NaN and infinities are
    read as json reads them (orjson alone refuses them)."""
    text = json.dumps(value).encode()
    assert _same(jsontext.loads(text), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": 123456789012345678901234}',  # beyond uint64: an int, not 1.2345678901234568e+23
        b"[18446744073709551616, -9223372036854775809]",
        b'{"n": NaN, "i": -Infinity}',
        b'"\\ud800"',  # a lone surrogate escape: orjson refuses it, json reads it
        b'{"a": 1, "a": 2}',  # the last value wins in both
    ],
)
def test_the_inputs_where_orjson_differs(text: bytes) -> None:
    assert _same(jsontext.loads(text), json.loads(text))


@pytest.mark.parametrize("text", [b"", b"{", b'{"a":}', b"\xff", b"[1,]", b"nul"])
def test_bad_json_raises_json_s_error(text: bytes) -> None:
    with pytest.raises(ValueError) as got:
        jsontext.loads(text)
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)
