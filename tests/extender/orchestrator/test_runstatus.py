"""When a completed lease starts an orchestrator run (extender/orchestrator/runstatus.py): pure."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from extender.orchestrator import profile
from extender.orchestrator.runner import Outcome, RunResult, State
from extender.orchestrator.runstatus import (
    Action,
    OrchestrationStatus,
    RunPhase,
    decide,
    parse_status,
)
from flexlease.api import keys
from tests.extender.lease.builders import lease
from tests.extender.orchestrator.pods import NS, OWNER, pod

NOW = datetime(2026, 11, 22, 18, 0, tzinfo=UTC)
PROFILES = profile.builtin()
JOB = "job"  # the owner label value Kubernetes allows: the namespace completes it


def done_lease(*, annotations: dict[str, str] | None = None, phase: str = "Done") -> dict[str, Any]:
    obj = lease("lend-1", "Lend", owner=OWNER, count=1)
    obj["metadata"].update({"uid": "lease-uid", "generation": 1, "annotations": annotations or {}})
    obj["status"] = {"phase": phase}
    return obj


def ray_job(**labels: str) -> list[dict[str, Any]]:
    pods = [
        pod("head-0", "head", owner=JOB, framework="ray"),
        pod("w-0", "worker", owner=JOB, framework="ray"),
    ]
    pods.append(pod("w-1", "worker", owner=JOB, framework="ray"))
    for p in pods:
        p["metadata"]["labels"].update(labels)
    return pods


def test_a_done_lease_of_an_orchestrated_job_starts_a_run() -> None:
    d = decide(done_lease(), ray_job(), PROFILES, now=NOW)
    assert d.action is Action.RUN and not d.resumed
    assert d.profile is not None and d.profile.name == "ray"
    assert d.job is not None and (d.job.namespace, d.job.owner, dict(d.job.replicas)) == (
        NS,
        JOB,
        {"head": 1, "worker": 2},
    )
    assert d.status is not None
    assert (d.status.phase, d.status.starts, d.status.lease_uid, d.status.lease_generation) == (
        RunPhase.RUNNING,
        1,
        "lease-uid",
        1,
    )


def test_nothing_to_do_before_done_or_without_a_framework() -> None:
    assert decide(done_lease(phase="InProgress"), ray_job(), PROFILES, now=NOW).action is Action.NONE
    plain = [pod("w-0", "worker", owner=JOB)]
    assert decide(done_lease(), plain, PROFILES, now=NOW).action is Action.NONE
    other_ns = ray_job()
    for p in other_ns:
        p["metadata"]["namespace"] = "elsewhere"
    assert decide(done_lease(), other_ns, PROFILES, now=NOW).action is Action.NONE
    assert decide({"metadata": "x"}, ray_job(), PROFILES, now=NOW).action is Action.NONE
    # leaving or finished pods are not the job
    gone = ray_job()
    gone[0]["metadata"]["deletionTimestamp"] = "2026-11-22T17:00:00Z"
    d = decide(done_lease(), gone, PROFILES, now=NOW)
    assert d.job is not None and dict(d.job.replicas) == {"worker": 2}


def test_refusals_are_final_and_clear() -> None:
    mixed = ray_job()
    mixed[1]["metadata"]["labels"][keys.LABEL_FRAMEWORK] = "mpi"
    d = decide(done_lease(), mixed, PROFILES, now=NOW)
    assert d.action is Action.REFUSE and "name several frameworks: mpi, ray" in d.reason
    unknown = ray_job(**{keys.LABEL_FRAMEWORK: "jax"})
    d = decide(done_lease(), unknown, PROFILES, now=NOW)
    assert d.action is Action.REFUSE
    assert d.reason == "no framework profile 'jax' (profiles: mpi, pytorch, ray, tensorflow)"
    assert d.status is not None and d.status.phase is RunPhase.REFUSED and d.status.final
    again = done_lease(annotations={keys.ANN_ORCHESTRATION_STATUS: d.status.render()})
    assert decide(again, unknown, PROFILES, now=NOW).action is Action.FINISHED


def test_the_run_waits_for_the_in_place_restarts() -> None:
    opted = ray_job(**{keys.LABEL_RESTART_POLICY: keys.RESTART_POLICY_IN_PLACE})
    assert decide(done_lease(), opted, PROFILES, now=NOW).action is Action.WAIT  # not started yet
    progressing = '{"revision":"lend-lend-1","phase":"Progressing","updated":1,"total":3}'
    d = decide(done_lease(annotations={keys.ANN_ROLLOUT_STATUS: progressing}), opted, PROFILES, now=NOW)
    assert (d.action, d.reason) == (Action.WAIT, "in-place restarts in progress (1/3)")
    complete = progressing.replace("Progressing", "Complete").replace('"updated":1', '"updated":3')
    d = decide(done_lease(annotations={keys.ANN_ROLLOUT_STATUS: complete}), opted, PROFILES, now=NOW)
    assert d.action is Action.RUN
    failed = '{"revision":"lend-lend-1","phase":"Failed","lastError":"w-1: image pull failed"}'
    d = decide(done_lease(annotations={keys.ANN_ROLLOUT_STATUS: failed}), opted, PROFILES, now=NOW)
    assert d.action is Action.REFUSE and d.reason.endswith("failed: w-1: image pull failed")


def test_no_run_for_a_lease_whose_reconfiguration_the_age_guard_skipped() -> None:
    skipped = (
        '{"revision":"lend-lend-1","phase":"Skipped","message":"completed before this controller started"}'
    )
    for pods in (ray_job(), ray_job(**{keys.LABEL_RESTART_POLICY: keys.RESTART_POLICY_IN_PLACE})):
        d = decide(done_lease(annotations={keys.ANN_ROLLOUT_STATUS: skipped}), pods, PROFILES, now=NOW)
        assert d.action is Action.NONE
        assert d.reason == "the lease's reconfiguration was skipped: completed before this controller started"


def test_a_running_status_resumes_with_its_steps_and_a_final_one_is_never_rerun() -> None:
    first = decide(done_lease(), ray_job(), PROFILES, now=NOW)
    assert first.status is not None
    running = first.status.model_copy(update={"done": (("head-start", "uid-head-0"),)})
    lease_obj = done_lease(annotations={keys.ANN_ORCHESTRATION_STATUS: running.render()})
    scaled = ray_job()[:2]  # a worker went meanwhile: the run keeps its expectations
    d = decide(lease_obj, scaled, PROFILES, now=NOW)
    assert d.action is Action.RUN and d.resumed and d.status is not None
    assert d.status.done == (("head-start", "uid-head-0"),) and d.status.starts == 2
    assert d.job is not None and dict(d.job.replicas) == {"head": 1, "worker": 2}
    result = RunResult(
        outcomes={
            "head-start": Outcome("head-start", State.SUCCEEDED, 1),
            "worker-join": Outcome("worker-join", State.TIMED_OUT, 0, "preconditions unmet after 300 s"),
        },
        steps=(),
        done=frozenset({("head-start", "uid-head-0")}),
    )
    final = d.status.finished(result, now=NOW)
    assert final.phase is RunPhase.FAILED
    assert final.message == "worker-join TimedOut: preconditions unmet after 300 s"
    assert final.commands["worker-join"].state == "TimedOut"
    finished = done_lease(annotations={keys.ANN_ORCHESTRATION_STATUS: final.render()})
    assert decide(finished, ray_job(), PROFILES, now=NOW).action is Action.FINISHED
    # a new generation of the lease (or another lease of that name) is a new run
    newer = copy.deepcopy(finished)
    newer["metadata"]["generation"] = 2
    assert decide(newer, ray_job(), PROFILES, now=NOW).action is Action.RUN


def test_status_round_trips_and_garbage_reads_as_absent() -> None:
    status = OrchestrationStatus(
        lease_uid="u", lease_generation=3, phase=RunPhase.RUNNING, done=(("a", "b"),)
    )
    assert parse_status(status.render()) == status
    assert '"leaseGeneration":3' in status.render()
    for bad in (None, "", "{", '{"phase": "Nope"}', 7):
        assert parse_status(bad) is None
