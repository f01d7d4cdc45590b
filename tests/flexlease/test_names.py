"""Kubernetes' name rules (flexlease.api.names): the msgspec and pydantic spellings of each
rule accept exactly what apimachinery's validation accepts."""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from flexlease.api import names

# apimachinery's validation.go, spelled out (Go's regexp: ``$`` is the end of the text)
REFERENCE = {
    "subdomain": (r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", 253),
    "label": (r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", 63),
    "label value": (r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", 63),
}
SPELLINGS = {
    "subdomain": (names.Subdomain, names.SubdomainField),
    "label": (names.Namespace, names.NamespaceField),
    "label value": (None, names.LabelValueField),
}


def _msgspec_ok(kind: object, value: str) -> bool:
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError:
        return False
    return True


def _pydantic_ok(kind: object, value: str) -> bool:
    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return False
    return True


_texts = st.one_of(
    st.text(alphabet="abz09-.AZ_\n\x00\u202eｎ", max_size=12),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,5}[a-z0-9])?(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
    st.text(max_size=6),
)


@settings(max_examples=400, deadline=None)
@given(value=_texts, rule=st.sampled_from(sorted(REFERENCE)))
def test_both_spellings_accept_what_apimachinery_accepts(value: str, rule: str) -> None:
    pattern, limit = REFERENCE[rule]
    expected = re.fullmatch(pattern, value) is not None and len(value) <= limit
    fast, model = SPELLINGS[rule]
    if fast is not None:
        assert _msgspec_ok(fast, value) is expected, value
    assert _pydantic_ok(model, value) is expected, value


@pytest.mark.parametrize("value", ["a" * 253, "a." * 126 + "a"])
def test_the_length_limits_are_inclusive(value: str) -> None:
    assert _msgspec_ok(names.NodeName, value) and _pydantic_ok(names.NodeNameField, value)
    assert not _pydantic_ok(names.NodeNameField, value + "a")
    assert not _msgspec_ok(names.NodeName, value + "a")


def test_a_trailing_newline_is_refused_by_both_engines() -> None:
    """Python's ``$`` also matches before a final newline: the msgspec spelling ends in ``\\Z``."""
    for kind in (names.NodeName, names.Namespace, names.UidOrEmpty):
        assert not _msgspec_ok(kind, "abc\n")
    for model in (names.NodeNameField, names.NamespaceField, names.UidField):
        assert not _pydantic_ok(model, "abc\n")


def test_uids_and_times() -> None:
    for uid in ("0548e338-a48b-49c4-b60d-396545eabc13", "u-1", "uid-000001"):
        assert _pydantic_ok(names.UidField, uid) and _msgspec_ok(names.UidOrEmpty, uid)
    for uid in ("", "-u", "u\x00", "u" * 129, "ü"):
        assert not _pydantic_ok(names.UidField, uid)
    assert _pydantic_ok(names.UidOrEmptyField, "") and _msgspec_ok(names.UidOrEmpty, "")
    for when in ("2026-11-21T23:00:00Z", "2026-11-21T23:00:00.123456+01:00"):
        assert _pydantic_ok(names.TimestampField, when)
    for when in ("2026-11-21", "yesterday", "2026-11-21T23:00:00"):
        assert not _pydantic_ok(names.TimestampField, when)


def test_explain_puts_the_rule_in_words() -> None:
    with pytest.raises(msgspec.ValidationError) as fast:
        msgspec.convert("N", names.NodeName)
    with pytest.raises(ValidationError) as model:
        TypeAdapter(names.NodeNameField).validate_python("N")
    for message in (str(fast.value), model.value.errors()[0]["msg"]):
        assert names.explain(message).startswith(
            "expected a lowercase RFC 1123 subdomain: at most 253 characters"
        )
    assert names.explain("something else") == "something else"
