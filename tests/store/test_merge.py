"""JSON merge patch: RFC 7386's own examples (§3 and Appendix A) and its algebra."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexlease.store.merge import merge_patch

# RFC 7386 Appendix A, row by row: (original, patch, result)
APPENDIX_A = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("original", "patch", "result"), APPENDIX_A)
def test_rfc7386_appendix_a(original: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy((original, patch))
    assert merge_patch(original, patch) == result
    assert (original, patch) == before  # inputs untouched


def test_rfc7386_section_3_example() -> None:
    target = json.loads(
        '{"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"},'
        ' "tags": ["example", "sample"], "content": "This will be unchanged"}'
    )
    patch = json.loads(
        '{"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": null},'
        ' "tags": ["example"]}'
    )
    assert merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["example"],
        "content": "This will be unchanged",
        "phoneNumber": "+01-123-456-7890",
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=12,
)


@given(json_values, json_values)
def test_patch_is_idempotent_and_pure(target: Any, patch: Any) -> None:
    before = copy.deepcopy((target, patch))
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    assert (target, patch) == before


@given(json_values)
def test_empty_patch_keeps_objects(target: Any) -> None:
    expected = target if isinstance(target, dict) else {}
    assert merge_patch(target, {}) == expected
