"""The pure parts of in-place rollouts: request/status parsing, max-unavailable, restart order."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.orchestrator import profile
from extender.rollout import plan as rollout
from extender.rollout.controller import pod_owner
from extender.rollout.order import OrdinalOrder, ProfileOrder, role_waves
from flexlease.api import keys

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def state(
    name: str, image: str = "a:v1", *, labels: dict[str, str] | None = None, **ann: str
) -> rollout.PodState:
    annotations = {keys.ANN_HOT_RESTART: ann["request"]} if "request" in ann else {}
    if "status" in ann:
        annotations[keys.ANN_HOT_RESTART_STATUS] = ann["status"]
    return rollout.read_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels or {}, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": image}]},
        }
    )


def test_max_unavailable_is_a_positive_integer_or_all() -> None:
    assert rollout.parse_max_unavailable(None, 4) == 1
    assert rollout.parse_max_unavailable("3", 4) == 3
    assert rollout.parse_max_unavailable("all", 4) == 4
    for bad in ("0", "-1", "25%", "", 2):
        with pytest.raises(ValueError, match="max-unavailable"):
            rollout.parse_max_unavailable(bad, 4)


@given(st.text(max_size=60))
def test_unreadable_annotations_read_as_absent_never_raise(text: str) -> None:
    for value in (text, json.dumps(text), json.dumps({"id": text})):
        rollout.parse_request(value)
        rollout.parse_result(value)
        rollout.parse_rollout_status(value)


def test_the_agent_s_status_fields_are_read() -> None:
    value = json.dumps({"id": "r", "phase": "Succeeded", "totalSeconds": 0.5, "pauseSeconds": 0.2, "x": 1})
    assert rollout.parse_result(value) == rollout.RestartResult("r", "Succeeded", None, 0.5, 0.2)
    assert rollout.parse_result(json.dumps({"id": "r", "phase": "Failed", "totalSeconds": True})) == (
        rollout.RestartResult("r", "Failed")
    )


def test_mpi_restarts_its_workers_before_the_coordinator() -> None:
    profiles = profile.builtin()
    assert role_waves(profiles["mpi"]) == [["worker"], ["coordinator"]]
    pods = [
        state("j-launcher", labels={keys.LABEL_FRAMEWORK: "mpi", keys.LABEL_ROLE: "coordinator"}),
        state("j-worker-0", labels={keys.LABEL_FRAMEWORK: "mpi", keys.LABEL_ROLE: "worker"}),
        state("j-worker-1", labels={keys.LABEL_FRAMEWORK: "mpi", keys.LABEL_ROLE: "worker"}),
    ]
    assert ProfileOrder(profiles).waves(pods) == [["j-worker-1", "j-worker-0"], ["j-launcher"]]
    # a pod without a role the profile names: one wave, by ordinal
    pods.append(state("j-x-7", labels={keys.LABEL_FRAMEWORK: "mpi"}))
    assert ProfileOrder(profiles).waves(pods) == [["j-x-7", "j-worker-1", "j-worker-0", "j-launcher"]]
    assert OrdinalOrder().waves([state("s-0"), state("s-10"), state("s-2")]) == [["s-10", "s-2", "s-0"]]


def test_a_pod_whose_spec_was_patched_but_whose_restart_runs_stays_unavailable() -> None:
    rid = rollout.request_id("rev", "c")
    running = json.dumps({"id": rid, "phase": "InProgress"})
    request = rollout.RestartRequest(rid, "c", "a:v2").render()
    pods = {
        "s-1": state("s-1", "a:v2", request=request, status=running),  # the agent patched the spec already
        "s-0": state("s-0"),
    }
    out = rollout.plan(
        revision="rev",
        targets={n: {"c": "a:v2"} for n in pods},
        waves=[["s-1", "s-0"]],
        pods=pods,
        previous=None,
        max_unavailable=1,
        now=NOW,
    )
    assert out.writes == ()
    assert (out.status.phase, out.status.current, out.status.updated) == (
        rollout.RolloutPhase.PROGRESSING,
        ("s-1",),
        0,
    )


def test_a_container_missing_from_the_pod_fails_the_rollout() -> None:
    out = rollout.plan(
        revision="rev",
        targets={"s-0": {"c": "a:v1", "sidecar": "b:v1"}},
        waves=[["s-0"]],
        pods={"s-0": state("s-0")},
        previous=None,
        max_unavailable=1,
        now=NOW,
    )
    assert out.status.phase is rollout.RolloutPhase.FAILED
    assert (
        out.status.last_error == "pod s-0: container 'sidecar' is not in the pod; adding one needs recreation"
    )


def test_pod_owner_reads_the_label_as_a_job_in_the_pods_namespace() -> None:
    def pod(labels: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "p", "namespace": "team", "labels": labels}}

    assert pod_owner(pod({keys.LABEL_OWNER: "job"})) == "team/job"
    # a hand-made label naming another namespace's job is not trusted: the pod is nobody's job
    assert pod_owner(pod({keys.LABEL_OWNER: "other/job"})) is None
    assert pod_owner(pod({})) is None
