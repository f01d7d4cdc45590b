"""Request bodies (extender.body): the general decoder's limits, and the ExtenderArgs fast
path giving exactly what the general path gives, or handing the body over."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from extender import body
from flexlease.api import wire
from tests.extender import payloads


def _general(raw: bytes) -> wire.ExtenderArgs:
    return wire.ExtenderArgs.model_validate(body.decode(raw))


def _general_refuses(raw: bytes) -> bool:
    """Whether the general way answers ``raw`` with a 400 (bad JSON, a field Kubernetes
    does not allow)."""
    try:
        _general(raw)
    except (body.BodyError, ValidationError):
        return True
    return False


def _handed_over(raw: bytes) -> None:
    """``raw``, which the fast path handed over, is one the general way refuses, or one that
    may hold an integer beyond 64 bits (the fast path leaves those to the reference decoder)."""
    assert _general_refuses(raw) or re.search(rb"[0-9]{19}", raw) is not None, raw


def _members(args: body.CandidateArgs | wire.ExtenderArgs) -> tuple[Any, Any, Any]:
    """What the verbs read of either kind of args (the fast path's or the model)."""
    return args.pod, args.nodes, args.node_names


def _envelope(pod: Any, names: Any, *, nodes: str = "null", compact: bool = False) -> bytes:
    """An ExtenderArgs body; ``compact``: without spaces, as Go's encoding/json writes it."""
    separators = (",", ":") if compact else None
    return (
        b'{"Pod":'
        + json.dumps(pod, separators=separators).encode()
        + b',"Nodes":'
        + nodes.encode()
        + b',"NodeNames":'
        + json.dumps(names, separators=separators).encode()
        + b"}"
    )


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_node_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]{1,3}){0,2}", fullmatch=True)
"""Node names Kubernetes allows (DNS-1123 subdomains)."""
_names = st.one_of(_node_names, st.text(max_size=12))
"""Node names as a hostile client may send them: mostly valid, some any text."""
_pods = st.one_of(
    st.dictionaries(st.text(max_size=8), _json, max_size=4),
    st.fixed_dictionaries(
        {
            "metadata": st.fixed_dictionaries(
                {"name": _node_names}, optional={"namespace": _names, "x": _json}
            )
        },
        optional={"spec": _json, "status": _json, "x": _json},
    ),
)
"""Pods: any JSON object, or one with a valid name and any other members."""


@settings(max_examples=300, deadline=None)
@given(pod=_pods, other=_pods, names=st.lists(_names, max_size=20), compact=st.booleans())
def test_the_fast_path_gives_what_the_general_path_gives(
    pod: dict[str, Any], other: dict[str, Any], names: list[str], compact: bool
) -> None:
    """The first body splits the envelope; the second (another pod, the same node list)
    is split by the kept list's text when compact, as kube-scheduler sends it."""
    raw = _envelope(pod, names, compact=compact)
    then = _envelope(other, names, compact=compact)
    decoder = body.ExtenderArgsDecoder()
    for text in (raw, raw, then, then):
        args = decoder.decode(text)
        if args is None:
            _handed_over(text)
            continue
        expected = _general(text)
        assert _members(args) == _members(expected)
        assert args.candidate_names() == expected.candidate_names()


def test_a_body_ending_in_a_kept_list_is_split_at_the_envelope() -> None:
    names = [f"gpu-{i:04d}" for i in range(50)]
    decoder = body.ExtenderArgsDecoder()
    first = decoder.decode(_envelope({"metadata": {"name": "a"}}, names, compact=True))
    assert first is not None and (decoder.hits, decoder.misses) == (0, 2)
    # the pod's text holds the envelope's own tail and the list: still split at the end
    tricky = {
        "metadata": {"name": "a"},
        "x": ',"Nodes":null,"NodeNames":' + json.dumps(names, separators=(",", ":")),
    }
    raw = _envelope(tricky, names, compact=True)
    args = decoder.decode(raw)
    assert args is not None and args.node_names is first.node_names
    assert _members(args) == _members(_general(raw))
    assert (decoder.hits, decoder.misses) == (1, 3)
    # a pod that is not one JSON value where the split would put it: the envelope decides
    for bad in (b'{"Pod":{"a":1}}, {"b":2', b'{"Pod":1,"Nodes":null,"NodeNames":[]'):
        raw = bad + b',"Nodes":null,"NodeNames":' + json.dumps(names, separators=(",", ":")).encode() + b"}"
        assert decoder.decode(raw) is None


def test_a_new_list_is_split_at_the_last_tail() -> None:
    """kube-scheduler's body with a list not seen before is split at its last
    ``,"Nodes":null,"NodeNames":``, also when the pod holds those very members."""
    names = [f"gpu-{i:04d}" for i in range(50)]
    text = json.dumps(names, separators=(",", ":"))
    tricky = b'{"metadata":{"name":"a"},"x":1,"Nodes":null,"NodeNames":' + text.encode() + b"}"
    for pod in (b'{"metadata":{"name":"a"}}', tricky):
        raw = b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + json.dumps(names[::-1]).encode() + b"}"
        assert raw.count(b',"Nodes":null,"NodeNames":') == (2 if pod is tricky else 1)
        args = body.ExtenderArgsDecoder().decode(raw)
        assert args is not None and _members(args) == _members(_general(raw))
        assert args.node_names == names[::-1] and args.pod == json.loads(pod)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"Xod":{},"Nodes":null,"NodeNames":["a"]}',  # not the pod's member
        b'{"Pod":{},"Nodes":null,"NodeNames":["a"]} ',  # not where Go's encoder ends
        b'{"Pod": {}, "Nodes": null, "NodeNames": ["a"]}',  # not compact
        b'{"Pod":{},"NodeNames":["a"],"Nodes":null}',  # not in Go's field order
        b'{"Pod":{},"Nodes":null,"NodeNames":["\xff"]}',  # a name that is not UTF-8
        b'{"Pod":{"a":NaN},"Nodes":null,"NodeNames":["a"]}',  # a pod orjson refuses
        b'{"Pod":{},"Nodes":null,"NodeNames":["a"],"nodenames":["b"]}',  # a member more
    ],
)
def test_a_body_not_exactly_as_kube_scheduler_writes_it_goes_the_general_way(raw: bytes) -> None:
    assert body.ExtenderArgsDecoder().decode(raw) is None


_PIECES = st.sampled_from(
    [
        b'{"Pod":',
        b',"Nodes":null,"NodeNames":',
        b"[",
        b"]",
        b"{",
        b"}",
        b'"a"',
        b",",
        b":",
        b"null",
        b'"\\"',
        b'\\"',
        b"1",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=14).map(b"".join))
def test_a_body_pieced_from_envelope_fragments_decodes_as_json_says_or_goes_the_general_way(
    middle: bytes,
) -> None:
    """Whatever the split finds, the fast path answers only what the general path answers."""
    for raw in (b'{"Pod":' + middle + b"]}", b'{"Pod":{' + middle + b',"Nodes":null,"NodeNames":["x"]}'):
        args = body.ExtenderArgsDecoder().decode(raw)
        if args is None:
            continue
        assert _members(args) == _members(_general(raw))


def test_a_real_filter_body_reuses_the_pod_and_the_node_list() -> None:
    pod = payloads.pod("train-0", gpus=2, priority="high", owner="job-a", tier="HA")
    names = [f"gpu-{i:04d}" for i in range(1250)]
    raw = json.dumps(payloads.extender_args(pod, names), separators=(",", ":")).encode()  # as Go writes it
    decoder = body.ExtenderArgsDecoder()
    first = decoder.decode(raw)
    assert first is not None and (decoder.hits, decoder.misses) == (0, 2)
    # prioritize: the same pod, fewer nodes
    second = decoder.decode(
        json.dumps(payloads.extender_args(pod, names[:3]), separators=(",", ":")).encode()
    )
    assert second is not None and second.pod is first.pod and second.node_names == names[:3]
    third = decoder.decode(raw)
    assert third is not None and third.node_names is first.node_names
    assert (decoder.hits, decoder.misses) == (3, 3)
    assert _members(third) == _members(_general(raw))


@settings(max_examples=200, deadline=None)
@given(names=st.lists(_node_names, max_size=20), pod=_pods)
def test_an_announced_list_is_used_as_its_decoding(names: list[str], pod: dict[str, Any]) -> None:
    """A list announced with its orjson text (the filter reply's NodeNames: candidates that
    passed the checks) is not decoded again: the prioritize body ending in it gives what the
    general path gives."""
    decoder = body.ExtenderArgsDecoder()
    text = orjson.dumps(names)
    decoder.announce(text, names)
    raw = b'{"Pod":' + orjson.dumps(pod) + b',"Nodes":null,"NodeNames":' + text + b"}"
    args = decoder.decode(raw)
    if args is None:
        _handed_over(raw)
        return
    assert args.node_names is names and decoder.misses == 1  # the pod only
    assert _members(args) == _members(_general(raw))


@settings(max_examples=200, deadline=None)
@given(
    universe=st.lists(_names, max_size=30, unique=True),
    picks=st.lists(st.integers(0, 40), max_size=25),
    stranger=st.booleans(),
)
def test_interned_names_decode_into_the_interned_strings(
    universe: list[str], picks: list[int], stranger: bool
) -> None:
    """After intern(U), a list drawn from U's valid node names decodes into U's own string
    objects; a list with any other valid name decodes into new ones; either way what the
    general path gives. A list with a name Kubernetes does not allow is handed over and
    refused, also when U holds that name (a test store's GPUNode may)."""
    universe = [n.encode().decode() for n in universe]  # objects of their own
    names = [universe[i % len(universe)] for i in picks] if universe else []
    if stranger:
        names.append("not-in-the-universe")
    decoder = body.ExtenderArgsDecoder()
    decoder.intern(universe)
    decoder.intern(universe)  # the same list again: kept as it is
    raw = _envelope({"metadata": {"name": "p"}}, names, compact=True)
    args = decoder.decode(raw)
    if not all(
        re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", n) for n in names
    ):
        assert args is None and _general_refuses(raw)
        return
    assert args is not None and args.node_names is not None
    assert args.node_names == _general(raw).node_names == names
    own = {id(n) for n in universe}
    assert all(id(n) in own for n in args.node_names) == (not stranger or not names)


def test_interning_a_new_universe_replaces_the_old() -> None:
    first = [f"gpu-{i}".encode().decode() for i in range(3)]
    second = [n.encode().decode() for n in first] + ["gpu-3"]
    decoder = body.ExtenderArgsDecoder()
    decoder.intern(first)
    decoder.intern(second)
    args = decoder.decode(_envelope({"metadata": {"name": "p"}}, ["gpu-3", "gpu-0"], compact=True))
    assert args is not None and args.node_names is not None
    assert [id(n) for n in args.node_names] == [id(second[3]), id(second[0])]
    decoder.intern([])  # nothing to intern: lists decode into new strings
    args = decoder.decode(_envelope({"metadata": {"name": "p"}}, ["gpu-1"], compact=True))
    assert args is not None and args.node_names == ["gpu-1"] and args.node_names[0] is not second[1]


def test_entries_are_bounded() -> None:
    decoder = body.ExtenderArgsDecoder(pods=2, lists=1)
    for i in range(5):
        assert decoder.decode(_envelope({"metadata": {"name": f"p{i}"}}, [f"n{i}"])) is not None
    assert len(decoder._pods) == 2 and len(decoder._lists) == 1
    with pytest.raises(ValueError, match="at least 1"):
        body.ExtenderArgsDecoder(pods=0)


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "raw",
    [
        b'{"pod": {}, "Nodes": null, "NodeNames": []}',  # Go decodes keys case-insensitively
        b'{"Pod": {}, "Nodes": {"items": []}, "NodeNames": null}',  # not nodeCacheCapable
        b'{"Pod": {}, "Nodes": null, "NodeNames": null}',
        b'{"Pod": {}, "Nodes": null, "NodeNames": ["a", 1]}',
        b'{"Pod": [], "Nodes": null, "NodeNames": []}',
        b'{"Pod": {"n": 123456789012345678901}, "Nodes": null, "NodeNames": []}',  # beyond int64
        b'{"Pod": {"n": NaN}, "Nodes": null, "NodeNames": []}',
        b'{"Pod": {}, "Nodes": null, "NodeNames": []',
        b"[]",
        _envelope(_nested(100), []),  # the whole body nests 101 deep
        b'{"Pod": ' + b"[" * 5000 + b"]" * 5000 + b', "NodeNames": []}',
    ],
)
def test_bodies_not_in_the_exact_shape_go_the_general_way(raw: bytes) -> None:
    assert body.ExtenderArgsDecoder().decode(raw) is None


@pytest.mark.parametrize(
    "literal", [b"12345678901234567890", b"18446744073709551615", b"-9223372036854775808"]
)
def test_long_integers_within_64_bits_stay_exact_integers(literal: bytes) -> None:
    """orjson may read them as floats; the reference decoder (which decides) as integers."""
    raw = b'{"Pod": {"x": ' + literal + b'}, "Nodes": null, "NodeNames": []}'
    assert body.decode(raw)["Pod"]["x"] == int(literal)
    assert type(body.decode(raw)["Pod"]["x"]) is int
    assert body.ExtenderArgsDecoder().decode(raw) is None


@pytest.mark.parametrize(
    "literal", [b"18446744073709551616", b"-9223372036854775809", b"99999999999999999999"]
)
def test_integers_outside_64_bits_are_refused(literal: bytes) -> None:
    """No Kubernetes integer, and orjson could not write one back in a reply (issue #37)."""
    raw = b'{"Pod": {"x": ' + literal + b'}, "Nodes": null, "NodeNames": []}'
    with pytest.raises(body.BodyError, match="outside the 64-bit range") as info:
        body.decode(raw)
    assert info.value.reason == "bad_json"


def test_lone_surrogates_are_refused_naming_the_member() -> None:
    """Python's json reads ``"\\ud800"`` (orjson and msgspec do not); no reply, no log line in
    orjson and no Go client can carry it, so the body is refused where it is (issue #37). A
    surrogate pair is a character like any other."""
    for raw, where in (
        (rb'{"Pod": {}, "Nodes": null, "NodeNames": ["n1", "\ud800"]}', "NodeNames[1]"),
        (rb'{"Pod": {"metadata": {"labels": {"\udfff": "x"}}}}', 'Pod.metadata.labels["\\udfff"]'),
        (rb'{"Pod": {"a": "\udc00\ud800"}}', "Pod.a"),
    ):
        with pytest.raises(body.BodyError) as info:
            body.decode(raw)
        assert info.value.reason == "bad_string"
        assert str(info.value).startswith(f"{where}: a string that is not valid Unicode"), str(info.value)
    assert body.decode(rb'{"a": "\ud83d\ude00", "\\ud800": 1}') == {"a": "\U0001f600", "\\ud800": 1}


def test_the_depth_limit_counts_the_envelope() -> None:
    raw = _envelope({"metadata": {"name": "p"}, "a": _nested(98)}, ["n1"])  # 100 levels in all: accepted
    args = body.ExtenderArgsDecoder().decode(raw)
    assert args is not None and _members(args) == _members(_general(raw))
    with pytest.raises(body.BodyError, match="deeper than 100") as info:
        body.decode(_envelope({"metadata": {"name": "p"}, "a": _nested(99)}, ["n1"]))
    assert info.value.reason == "too_deep"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"a": 1234567890123456789012}', "bad_json"),
        (b'{"a": ', "bad_json"),
        (b"\xff", "bad_json"),
        (b"[" * 101 + b"]" * 101, "too_deep"),
        (b"[" * 5000 + b"]" * 5000, "too_deep"),
    ],
)
def test_the_general_decoder_refuses_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(body.BodyError) as info:
        body.decode(raw)
    assert info.value.reason == reason
    assert body.decode(b'{"a": 12345678901234567890}') == {"a": 12345678901234567890}  # 20 digits


# --------------------------------------------------------------------------- /bind's args


def _general_binding(raw: bytes) -> wire.ExtenderBindingArgs | None:
    """What the general way makes of ``raw``: the model, or None where it answers 400."""
    try:
        value = body.decode(raw)
        return wire.ExtenderBindingArgs.model_validate(value) if isinstance(value, dict) else None
    except (body.BodyError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


_FIELDS = ("PodName", "PodNamespace", "PodUID", "Node")


def _fields(args: body.BindingArgs | wire.ExtenderBindingArgs) -> tuple[str, str, str, str]:
    return args.pod_name, args.pod_namespace, args.pod_uid, args.node


@settings(max_examples=400, deadline=None)
@given(
    members=st.lists(
        st.tuples(
            st.sampled_from((*_FIELDS, "podName", "NODE", "Extra", "")),
            st.text(max_size=4) | st.integers(-3, 3) | st.none() | st.lists(st.text(max_size=2), max_size=2),
        ),
        max_size=7,
    ),
    spaced=st.booleans(),
)
def test_binding_args_fast_path_gives_what_the_general_path_gives(
    members: list[tuple[str, Any]], spaced: bool
) -> None:
    """Any object of those keys (repeated, in another case, unknown, missing, of any type):
    the fast path's args are the model's, and it hands over every body the general way
    would answer differently."""
    separator = ", " if spaced else ","
    raw = ("{" + separator.join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}").encode()
    fast = body.decode_binding_args(raw)
    if fast is None:
        return
    expected = _general_binding(raw)
    assert expected is not None, raw
    assert _fields(fast) == _fields(expected)


def test_binding_args_as_kube_scheduler_sends_them_take_the_fast_path() -> None:
    raw = b'{"PodName":"train-0","PodNamespace":"batch","PodUID":"3f1c","Node":"gpu-00012"}'
    args = body.decode_binding_args(raw)
    assert args is not None
    assert _fields(args) == ("train-0", "batch", "3f1c", "gpu-00012")
    assert _fields(args) == _fields(wire.ExtenderBindingArgs.model_validate(orjson.loads(raw)))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"podName":"p","PodNamespace":"n","PodUID":"u","Node":"x"}',  # Go matches keys in any case
        b'{"PodName":"p","PodNamespace":"n","PodUID":"u","Node":"x","podname":"q"}',  # …the last one wins
        b'{"PodName":"","PodNamespace":"n","PodUID":"u","Node":"x"}',
        b'{"PodName":"p","PodNamespace":"n","Node":"x"}',
        b'{"PodName":"p","PodNamespace":"n","PodUID":1,"Node":"x"}',
        b'{"PodName":"\\ud800","PodNamespace":"n","PodUID":"u","Node":"x"}',  # a lone surrogate
        b'{"PodName":"\xff","PodNamespace":"n","PodUID":"u","Node":"x"}',
        b'[{"PodName":"p"}]',
        b"",
    ],
)
def test_binding_args_not_in_the_exact_shape_go_the_general_way(raw: bytes) -> None:
    assert body.decode_binding_args(raw) is None
