"""core/v1 Event objects (extender/lease/events.py)."""

from __future__ import annotations

from extender.lease.events import COMPONENT, MESSAGE_LIMIT, ObjectRef, event_object
from extender.lease.planner import EventType
from tests.extender.lease.builders import T0


def test_event_has_the_core_v1_shape() -> None:
    event = event_object(
        ObjectRef.pod("lp", "lp-a", "uid-1"),
        "PreemptNotice",
        message="x" * 5000,
        type=EventType.WARNING,
        now=T0,
        instance="h",
    )
    assert event["metadata"]["namespace"] == "lp" and event["metadata"]["name"].startswith("lp-a.")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "lp-a",
        "namespace": "lp",
        "uid": "uid-1",
    }
    assert (event["reason"], event["type"], event["count"]) == ("PreemptNotice", "Warning", 1)
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-03-01T12:00:00Z"
    assert event["source"] == {"component": COMPONENT} and event["reportingInstance"] == "h"
    assert len(event["message"]) == MESSAGE_LIMIT


def test_events_of_cluster_scoped_objects_go_to_default_and_names_are_unique() -> None:
    ref = ObjectRef.gpunode("n1", None)
    a = event_object(ref, "StandbyPool", message="m", type=EventType.NORMAL, now=T0, instance="h")
    b = event_object(ref, "StandbyPool", message="m", type=EventType.NORMAL, now=T0, instance="h")
    assert a["metadata"]["namespace"] == "default" and "namespace" not in a["involvedObject"]
    assert a["metadata"]["name"] != b["metadata"]["name"]
