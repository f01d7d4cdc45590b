"""Orchestrator runs on lease completion (extender/orchestrator/relaunch.py) through the store
interface: a recording executor, restarts mid-run, the rollout gate, failures, refusals; and one
run through the real Kubernetes exec client against the ``pods/exec`` stand-in API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import Configuration
from prometheus_client import CollectorRegistry

from extender.orchestrator import profile, relaunch
from extender.orchestrator.executors import CriExecutor, ExecResult, Executor, KubeExecutor
from extender.orchestrator.relaunch import RelaunchController
from extender.orchestrator.runstatus import RunPhase, parse_status
from extender.orchestrator.snapshot import PodState
from flexlease.api import keys
from flexlease.clock import ManualClock
from flexlease.config import LeaseSettings, OrchestratorSettings, Settings
from flexlease.errors import StoreError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.lease.builders import lease
from tests.extender.orchestrator import exec_server
from tests.extender.orchestrator.pods import NS, OWNER, pod
from tests.store.faults import FaultyStore

JOB = "job"


class RecordingExecutor:
    """Records (pod, first argv word, command) per execution; ``fail`` answers exit 1."""

    def __init__(self, fail: Callable[[PodState, Sequence[str]], bool] | None = None) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.fail = fail

    async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult:
        self.calls.append((pod.name, tuple(argv)))
        await asyncio.sleep(0)
        if self.fail is not None and self.fail(pod, argv):
            return ExecResult(1, stderr=b"connection refused\n")
        return ExecResult(0)


def settings(**orchestrator: Any) -> Settings:
    return Settings(
        lease=LeaseSettings(resync_seconds=3600),
        orchestrator=OrchestratorSettings(**{"max_attempts": 1, "ready_timeout_seconds": 30, **orchestrator}),
    )


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 11, 22, 18, 0, tzinfo=UTC))


async def put_pod(store: MemoryStore, obj: dict[str, Any]) -> None:
    obj["metadata"].pop("uid", None)
    created = await store.create(Kind.POD, obj)
    await store.patch(
        Kind.POD, created["metadata"]["name"], {"status": obj["status"]}, namespace=NS, subresource="status"
    )


async def ray_job(store: MemoryStore, **labels: str) -> None:
    for name, role, port in (("head-0", "head", 6379), ("w-0", "worker", 0), ("w-1", "worker", 0)):
        obj = pod(name, role, owner=JOB, framework="ray", port=port)
        obj["metadata"]["labels"].update(labels)
        await put_pod(store, obj)


async def done_lease(
    store: MemoryStore, name: str = "lend-1", *, annotations: dict[str, str] | None = None
) -> None:
    obj = lease(name, "Lend", owner=OWNER, count=1)
    obj["metadata"].pop("creationTimestamp")
    obj["metadata"]["annotations"] = annotations or {}
    await store.create(Kind.GPULEASE, obj)
    await store.patch(Kind.GPULEASE, name, {"status": {"phase": "Done"}}, namespace=NS, subresource="status")


async def status_of(store: MemoryStore, name: str = "lend-1") -> Any:
    obj = await store.get(Kind.GPULEASE, name, namespace=NS)
    return parse_status((obj["metadata"].get("annotations") or {}).get(keys.ANN_ORCHESTRATION_STATUS))


async def until(check: Callable[[], Any], *, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await check():
        if loop.time() > end:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.01)


async def reasons(store: MemoryStore) -> list[str]:
    return sorted(e["reason"] for e in (await store.list(Kind.EVENT, namespace=NS)).items)


@contextlib.asynccontextmanager
async def running(
    store: MemoryStore,
    clock: ManualClock,
    executor: Executor,
    conf: Settings | None = None,
    profiles_by_name: dict[str, profile.Profile] | None = None,
) -> AsyncIterator[tuple[RelaunchController, CollectorRegistry]]:
    registry = CollectorRegistry()
    controller = RelaunchController(
        conf or settings(),
        store,
        executor=executor,
        registry=registry,
        clock=clock,
        instance="test",
        profiles_by_name=profiles_by_name,
    )
    task = asyncio.create_task(controller.run(), name="relaunch-under-test")
    try:
        await until(lambda: _true(controller.ready))
        yield controller, registry
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _true(value: bool) -> bool:
    return value


def _phase_is(store: MemoryStore, phase: RunPhase) -> Callable[[], Any]:
    async def check() -> bool:
        status = await status_of(store)
        return status is not None and status.phase is phase

    return check


async def test_a_completed_lease_runs_the_profile_once_and_records_it(
    store: MemoryStore, clock: ManualClock
) -> None:
    await ray_job(store)
    executor = RecordingExecutor()
    async with running(store, clock, executor) as (controller, registry):
        await done_lease(store)
        await until(_phase_is(store, RunPhase.SUCCEEDED))
        assert [c[0] for c in executor.calls] == ["head-0", "w-0", "w-1"]  # head first, then both workers
        assert executor.calls[1][1] == ("ray", "start", "--address=127.0.0.1:6379", "--disable-usage-stats")
        status = await status_of(store)
        assert status.profile == "ray" and status.replicas == {"head": 1, "worker": 2} and status.starts == 1
        assert {n: c.state for n, c in status.commands.items()} == {
            "head-start": "Succeeded",
            "worker-join": "Succeeded",
        }
        assert sorted(c for c, _ in status.done) == ["head-start", "worker-join", "worker-join"]
        assert await reasons(store) == ["OrchestrationStarted", "OrchestrationSucceeded"]
        assert registry.get_sample_value("flexlease_orchestration_runs_total", {"outcome": "succeeded"}) == 1
        assert (
            registry.get_sample_value("flexlease_orchestration_commands_total", {"state": "Succeeded"}) == 2
        )
        assert registry.get_sample_value("flexlease_orchestration_runs_in_progress") == 0
    # a restarted extender (a new leader) never runs a finished run again
    again = RecordingExecutor()
    async with running(store, clock, again) as (controller, _):
        await controller.reconcile(f"lease/{NS}/lend-1")
        assert not again.calls and not controller.running


async def test_a_run_cut_short_resumes_without_repeating_its_steps(
    store: MemoryStore, clock: ManualClock
) -> None:
    await ray_job(store)
    first = RecordingExecutor(fail=lambda p, argv: p.name == "w-1")  # w-1 cannot join yet
    gate = asyncio.Event()  # never set: the workers' executions hang until the leader goes

    class Stalling(RecordingExecutor):
        async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult:
            if pod.role == "worker":
                await gate.wait()  # the leader dies while the workers join
            return await super().exec(pod, argv, timeout_seconds=timeout_seconds)

    stalling = Stalling()
    async with running(store, clock, stalling):
        await done_lease(store)

        async def head_recorded() -> bool:
            status = await status_of(store)
            return status is not None and ("head-start", (await _uid(store, "head-0"))) in status.done

        await until(head_recorded)
    status = await status_of(store)
    assert status.phase is RunPhase.RUNNING and status.starts == 1
    async with running(store, clock, first):
        await until(_phase_is(store, RunPhase.FAILED))
    assert sorted(c[0] for c in first.calls) == ["w-0", "w-1"]  # the head is not started twice
    status = await status_of(store)
    assert status.starts == 2
    assert status.message.startswith(
        "worker-join Failed: failed 1 times; last: team-a/w-1: exit 1: connection refused"
    )
    assert await reasons(store) == ["OrchestrationFailed", "OrchestrationResumed", "OrchestrationStarted"]


async def _uid(store: MemoryStore, name: str) -> str:
    return str((await store.get(Kind.POD, name, namespace=NS))["metadata"]["uid"])


async def test_the_run_waits_for_the_rollout_controllers_restarts(
    store: MemoryStore, clock: ManualClock
) -> None:
    await ray_job(store, **{keys.LABEL_RESTART_POLICY: keys.RESTART_POLICY_IN_PLACE})
    executor = RecordingExecutor()
    async with running(store, clock, executor) as (controller, _):
        await done_lease(store)
        await controller.reconcile(f"lease/{NS}/lend-1")
        progressing = '{"revision":"lend-lend-1","phase":"Progressing","updated":0,"total":3}'
        await store.patch(
            Kind.GPULEASE,
            "lend-1",
            {"metadata": {"annotations": {keys.ANN_ROLLOUT_STATUS: progressing}}},
            namespace=NS,
        )
        await controller.reconcile(f"lease/{NS}/lend-1")
        assert not executor.calls and await status_of(store) is None
        complete = progressing.replace("Progressing", "Complete").replace('"updated":0', '"updated":3')
        await store.patch(
            Kind.GPULEASE,
            "lend-1",
            {"metadata": {"annotations": {keys.ANN_ROLLOUT_STATUS: complete}}},
            namespace=NS,
        )
        await until(_phase_is(store, RunPhase.SUCCEEDED))
        assert len(executor.calls) == 3


async def test_a_refused_run_is_recorded_once(store: MemoryStore, clock: ManualClock) -> None:
    await ray_job(store, **{keys.LABEL_FRAMEWORK: "jax"})
    executor = RecordingExecutor()
    async with running(store, clock, executor) as (controller, registry):
        await done_lease(store)
        await until(_phase_is(store, RunPhase.REFUSED))
        await controller.reconcile(f"lease/{NS}/lend-1")
        assert (await status_of(store)).message.startswith("no framework profile 'jax'")
        assert await reasons(store) == ["OrchestrationRefused"]
        assert registry.get_sample_value("flexlease_orchestration_runs_total", {"outcome": "refused"}) == 1
        assert not executor.calls


USER_PROFILE = """\
apiVersion: flexlease.io/v1alpha1
kind: FrameworkProfile
name: marker
roles:
  chief: {critical: true}
  worker: {}
commands:
  - name: worker-up
    role: worker
    run: [sh, -c, "echo {self.name} >> MARKS"]
  - name: chief-up
    role: chief
    run: [sh, -c, "echo {self.name} after {worker.count} >> MARKS"]
    preconditions: [{completed: worker-up}, {ready: worker}]
"""


async def test_a_run_through_kubernetes_exec_on_the_stand_in_api_server(
    store: MemoryStore, clock: ManualClock, tmp_path: Path
) -> None:
    """The configured executor for a cluster: ``pods/exec`` over the websocket protocol (the
    stand-in runs each command as a local process)."""
    marks = tmp_path / "marks"
    marker = profile.parse(USER_PROFILE.replace("MARKS", str(marks)), source="marker.yaml")
    for name, role in (("chief-0", "chief"), ("w-0", "worker"), ("w-1", "worker")):
        await put_pod(store, pod(name, role, owner=JOB, framework="marker"))
    server = TestServer(exec_server.create_app(store), host="127.0.0.1")
    await server.start_server()
    try:
        config = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with (
            KubeExecutor(config) as executor,
            running(store, clock, executor, profiles_by_name={"marker": marker}),
        ):
            await done_lease(store)
            await until(_phase_is(store, RunPhase.SUCCEEDED))
        lines = marks.read_text().splitlines()
        assert sorted(lines[:2]) == ["w-0", "w-1"] and lines[2] == "chief-0 after 2"
    finally:
        await server.close()


async def test_wiring_opens_the_configured_executor_and_runs_only_with_one(
    store: MemoryStore, clock: ManualClock
) -> None:
    assert await relaunch.open_executor(settings()) is None
    cri = await relaunch.open_executor(settings(executor="cri", cri_endpoint="unix:///nowhere.sock"))
    assert isinstance(cri, CriExecutor) and cri.endpoint == "unix:///nowhere.sock"
    await cri.close()
    for conf, executor, expect in (
        (settings(), None, False),  # executor: none
        (settings(), RecordingExecutor(), True),
        (Settings(lease=LeaseSettings(enabled=False)), RecordingExecutor(), False),
    ):
        app = web.Application()
        context = relaunch.cleanup_ctx(
            conf, store, registry=CollectorRegistry(), clock=clock, instance="t", executor=executor
        )
        gen = context(app)
        await gen.__anext__()
        assert (relaunch.RELAUNCH_CONTROLLER in app) is expect
        with contextlib.suppress(StopAsyncIteration):
            await gen.__anext__()


async def test_status_writes_are_retried_and_a_run_stopped_by_the_store_resumes(
    store: MemoryStore, clock: ManualClock
) -> None:
    await ray_job(store)
    faulty = FaultyStore(store)
    # the first annotation write fails twice (retried), later the final write fails for good
    faulty.fail(
        "patch", kind=Kind.GPULEASE, match="Running", times=2, error=lambda: StoreError("etcd timeout")
    )
    final = faulty.fail(
        "patch", kind=Kind.GPULEASE, match="Succeeded", times=5, error=lambda: StoreError("down")
    )
    executor = RecordingExecutor()
    registry = CollectorRegistry()
    controller = RelaunchController(
        settings(),
        faulty,
        executor=executor,
        registry=registry,
        clock=clock,
        instance="t",  # type: ignore[arg-type]
    )
    task = asyncio.create_task(controller.run(), name="relaunch-faulty")
    try:
        await until(lambda: _true(controller.ready))
        await done_lease(store)

        async def five_final_tries() -> bool:
            await clock.advance(1)
            return final.fired == 5 and not controller.running

        await until(five_final_tries)
        status = await status_of(store)
        assert status.phase is RunPhase.RUNNING and len(status.done) == 3  # progress was recorded
        assert len(executor.calls) == 3
        # the store is back: the requeued run resumes, repeats nothing and records the outcome
        await clock.advance(settings().lease.retry_max_seconds)
        await until(_phase_is(store, RunPhase.SUCCEEDED))
        assert len(executor.calls) == 3 and (await status_of(store)).starts == 2
        with pytest.raises(ValueError, match="unknown work-queue key"):
            await controller.reconcile("sts/x/y")
        await controller.reconcile(f"lease/{NS}/no-such-lease")  # gone: nothing to do
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_with_leader_election_only_the_leader_runs(store: MemoryStore, clock: ManualClock) -> None:
    conf = Settings(
        lease=LeaseSettings(leader_election=True, leader_lease_seconds=1.5, resync_seconds=3600),
        orchestrator=OrchestratorSettings(max_attempts=1),
    )
    await ray_job(store)
    a_exec, b_exec = RecordingExecutor(), RecordingExecutor()
    a = RelaunchController(
        conf, store, executor=a_exec, registry=CollectorRegistry(), clock=clock, instance="a"
    )
    b = RelaunchController(
        conf, store, executor=b_exec, registry=CollectorRegistry(), clock=clock, instance="b"
    )
    task_a = asyncio.create_task(relaunch.serve(a, conf, store=store, instance="a"), name="serve-a")
    await until(lambda: _true(a.ready))
    task_b = asyncio.create_task(relaunch.serve(b, conf, store=store, instance="b"), name="serve-b")
    try:
        await done_lease(store)
        await until(_phase_is(store, RunPhase.SUCCEEDED))
        assert len(a_exec.calls) == 3 and not b_exec.calls and not b.ready
    finally:
        for task in (task_a, task_b):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
