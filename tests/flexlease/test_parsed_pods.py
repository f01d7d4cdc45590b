"""flexlease.api.pod.ParsedPods: one parse per pod version, never a stale or wrong one."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlease.api import keys
from flexlease.api.pod import ParsedPods, parse_pod
from flexlease.errors import PodSpecError
from tests.flexlease.pods import make_pod


def versioned(rv: str = "7", **kw: Any) -> dict[str, Any]:
    pod = make_pod(**kw)
    pod["metadata"]["uid"] = "uid-1"
    pod["metadata"]["resourceVersion"] = rv
    return pod


def test_the_same_version_parses_once() -> None:
    pods = ParsedPods()
    first = pods.parse(versioned(gpus=2))
    again = pods.parse(json.loads(json.dumps(versioned(gpus=2))))  # an equal copy, as the next verb gets it
    assert again is first and (pods.hits, pods.misses) == (1, 1)


def test_a_changed_pod_is_parsed_again_even_under_the_same_version() -> None:
    pods = ParsedPods()
    assert pods.parse(versioned(gpus=2)).count == 2
    assert pods.parse(versioned(gpus=4)).count == 4, "same uid and resourceVersion, other content"
    assert pods.parse(versioned("8", gpus=2)).count == 2
    assert pods.misses == 3


def test_json_types_are_not_confused() -> None:
    """1 and true compare equal in Python; the cache tells them apart like parse_pod does."""
    pods = ParsedPods()
    good = versioned()
    good["spec"]["priority"] = 1
    assert pods.parse(good).priority_value == 1
    bad = copy.deepcopy(good)
    bad["spec"]["priority"] = True
    assert bad == good
    with pytest.raises(PodSpecError, match="priority"):
        pods.parse(bad)


def test_errors_are_not_cached_and_unversioned_pods_always_parse() -> None:
    pods = ParsedPods()
    bad = versioned()
    bad["metadata"]["labels"] = {keys.LABEL_PRIORITY: "High"}
    for _ in range(2):
        with pytest.raises(PodSpecError):
            pods.parse(bad)
    plain = make_pod(gpus=1)
    del plain["metadata"]["resourceVersion"]
    assert pods.parse(plain) == pods.parse(plain) and pods.hits == 0


def test_non_finite_and_huge_numbers_are_never_cached() -> None:
    pods = ParsedPods()
    nan = versioned()
    nan["spec"]["overhead"] = float("nan")  # orjson would write null
    pods.parse(nan)
    pods.parse(nan)
    huge = versioned()
    huge["spec"]["priority"] = 2**70  # beyond what orjson encodes
    assert pods.parse(huge) == pods.parse(huge) == parse_pod(huge)
    assert pods.hits == 0


def test_size_bounds_the_entries() -> None:
    pods = ParsedPods(size=2)
    for rv in ("1", "2", "3"):
        pods.parse(versioned(rv))
    pods.parse(versioned("1"))
    assert pods.misses == 4
    with pytest.raises(ValueError):
        ParsedPods(size=0)


@settings(max_examples=200, deadline=None)
@given(
    gpus=st.sampled_from([0, 1, 2]),
    priority=st.sampled_from([0, 1, True, 1.0, "1", None]),
    label=st.sampled_from(["high", "low", "High", None]),
    order=st.permutations(["a", "b"]),
)
def test_cached_answers_equal_parse_pod(
    gpus: int, priority: Any, label: str | None, order: list[str]
) -> None:
    pods = ParsedPods()
    base = versioned(gpus=gpus)
    for variant in (base, {**base, "spec": {**base["spec"], "priority": priority}}):
        pod = copy.deepcopy(variant)
        if label is not None:
            pod["metadata"]["labels"] = {keys.LABEL_PRIORITY: label}
        pod["metadata"]["annotations"] = {f"x/{k}": k for k in order}
        for _ in range(2):
            try:
                expected: Any = parse_pod(pod)
            except PodSpecError as exc:
                expected = str(exc)
            try:
                got: Any = pods.parse(pod)
            except PodSpecError as exc:
                got = str(exc)
            assert got == expected
