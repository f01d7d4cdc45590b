"""The runner against a real MemoryStore watch, a scripted executor and a manual clock:
ordering, preconditions on the latest snapshot, retries with back-off, timeouts, idempotency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import pytest

from extender.orchestrator import dag, profile
from extender.orchestrator.executors import ExecResult
from extender.orchestrator.runner import JobRef, RetryPolicy, Runner, RunResult, State
from extender.orchestrator.snapshot import PodState
from extender.orchestrator.watch import ReadinessWatch
from flexlease.clock import ManualClock
from flexlease.errors import ExecError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.orchestrator.pods import NS, OWNER, pod, status

Script = Callable[[PodState, Sequence[str]], ExecResult]


class FakeExecutor:
    """Records every execution; answers from ``script`` (default: exit 0)."""

    def __init__(self, script: Script | None = None) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.script = script

    async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult:
        self.calls.append((pod.name, tuple(argv)))
        await asyncio.sleep(0)
        return self.script(pod, argv) if self.script else ExecResult(0)


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 1, 1, tzinfo=UTC))


async def _put(store: MemoryStore, obj: dict[str, object]) -> None:
    created = await store.create(Kind.POD, obj)
    await store.patch(
        Kind.POD, created["metadata"]["name"], {"status": obj["status"]}, namespace=NS, subresource="status"
    )


async def _set_ready(store: MemoryStore, name: str, ready: bool) -> None:
    await store.patch(
        Kind.POD,
        name,
        {"status": status(ready=ready, running=True, name=name)},
        namespace=NS,
        subresource="status",
    )


async def _until(cond: Callable[[], bool], clock: ManualClock | None = None, step: float = 0.0) -> None:
    """Let the loop run until ``cond`` holds (advancing ``clock`` by ``step`` each turn)."""
    for _ in range(5000):
        if cond():
            return
        if clock is not None and step:
            await clock.advance(step)
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


async def _run(
    store: MemoryStore,
    clock: ManualClock,
    name: str,
    executor: FakeExecutor,
    *,
    replicas: dict[str, int],
    policy: RetryPolicy | None = None,
    done: frozenset[tuple[str, str]] = frozenset(),
    during: Callable[[asyncio.Task[RunResult]], object] | None = None,
) -> RunResult:
    prof = profile.builtin()[name]
    watch = ReadinessWatch(store, namespace=NS, owner=OWNER, roles=prof.roles)
    async with watch.running():
        runner = Runner(
            dag.build(prof), executor=executor, snapshots=watch, clock=clock, policy=policy or RetryPolicy()
        )
        task = asyncio.create_task(runner.run(JobRef(NS, OWNER, replicas), done=done), name="test-run")
        if during is not None:
            await during(task)  # type: ignore[misc]
        return await task


async def test_ray_workers_join_only_after_the_head_is_ready(store: MemoryStore, clock: ManualClock) -> None:
    await _put(store, pod("head-0", "head", ready=False, port=6379))
    await _put(store, pod("w-0", "worker"))
    await _put(store, pod("w-1", "worker"))
    executor = FakeExecutor()

    async def during(task: asyncio.Task[RunResult]) -> None:
        await _until(lambda: len(executor.calls) == 1)
        await asyncio.sleep(0.01)
        assert [c[0] for c in executor.calls] == ["head-0"]  # head-start only: the head is not Ready
        await _set_ready(store, "head-0", True)
        await _until(task.done)

    result = await _run(store, clock, "ray", executor, replicas={"worker": 2}, during=during)
    assert result.ok
    assert executor.calls[0] == ("head-0", ("ray", "start", "--head", "--port=6379", "--disable-usage-stats"))
    assert sorted(executor.calls[1:]) == [
        ("w-0", ("ray", "start", "--address=127.0.0.1:6379", "--disable-usage-stats")),
        ("w-1", ("ray", "start", "--address=127.0.0.1:6379", "--disable-usage-stats")),
    ]
    events = [(s.command, s.event) for s in result.steps]
    assert ("worker-join", "waiting") in events
    assert events.index(("head-start", "Succeeded")) < events.index(("worker-join", "exec"))
    assert {n: o.state for n, o in result.outcomes.items()} == {
        "head-start": State.SUCCEEDED,
        "worker-join": State.SUCCEEDED,
    }
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in (await store.list(Kind.POD)).items}
    assert result.done == {
        ("head-start", uids["head-0"]),
        ("worker-join", uids["w-0"]),
        ("worker-join", uids["w-1"]),
    }


async def test_mpirun_waits_for_every_expected_worker(store: MemoryStore, clock: ManualClock) -> None:
    await _put(store, pod("coord", "coordinator"))
    await _put(store, pod("w-0", "worker"))
    executor = FakeExecutor()

    async def during(task: asyncio.Task[RunResult]) -> None:
        await asyncio.sleep(0.02)
        assert executor.calls == []  # 1 of 2 expected workers
        await _put(store, pod("w-1", "worker", ready=False))
        await asyncio.sleep(0.02)
        assert executor.calls == []  # 2 of 2, one not Ready
        await _set_ready(store, "w-1", True)
        await _until(task.done)

    result = await _run(store, clock, "mpi", executor, replicas={"worker": 2}, during=during)
    assert result.ok
    assert executor.calls == [
        (
            "coord",
            (
                "mpirun",
                "--allow-run-as-root",
                "--host",
                "127.0.0.1,127.0.0.1",
                "-np",
                "2",
                "python3",
                "/app/train.py",
            ),
        )
    ]
    waits = [s.message for s in result.steps if s.event == "waiting"]
    assert waits[0] == "ready worker: 1/2 ready (1 of 2 pods missing)"
    assert "ready worker: 1/2 ready (team-a/w-1: ContainersNotReady)" in waits


async def test_failures_retry_with_bounded_exponential_backoff(
    store: MemoryStore, clock: ManualClock
) -> None:
    await _put(store, pod("coord", "coordinator"))
    await _put(store, pod("w-0", "worker"))
    outcomes = iter([ExecResult(1, stderr=b"ORTE was unable to reach w-0\n"), ExecResult(1), ExecResult(0)])
    executor = FakeExecutor(lambda p, a: next(outcomes))
    started = clock.now_utc()

    async def during(task: asyncio.Task[RunResult]) -> None:
        await _until(task.done, clock, 0.25)

    result = await _run(store, clock, "mpi", executor, replicas={"worker": 1}, during=during)
    assert result.ok and result.outcomes["mpirun"].attempts == 3
    backoffs = [s for s in result.steps if s.event == "backoff"]
    assert [s.message for s in backoffs] == ["retry in 1 s", "retry in 2 s"]
    assert (backoffs[1].at - backoffs[0].at).total_seconds() >= 1.0
    assert (result.steps[-1].at - started).total_seconds() >= 3.0
    first_exit = next(s for s in result.steps if s.event == "exited")
    assert first_exit.exit_code == 1 and "ORTE was unable" in first_exit.message


async def test_gives_up_after_max_attempts_and_skips_downstream(
    store: MemoryStore, clock: ManualClock
) -> None:
    await _put(store, pod("head-0", "head", port=6379))
    await _put(store, pod("w-0", "worker"))

    def refuse(p: PodState, argv: Sequence[str]) -> ExecResult:
        raise ExecError("CRI ExecSync: UNAVAILABLE")

    executor = FakeExecutor(refuse)

    async def during(task: asyncio.Task[RunResult]) -> None:
        await _until(task.done, clock, 0.5)

    policy = RetryPolicy(max_attempts=3)
    result = await _run(store, clock, "ray", executor, replicas={}, policy=policy, during=during)
    assert not result.ok
    head = result.outcomes["head-start"]
    assert (head.state, head.attempts) == (State.FAILED, 3)
    assert head.message == "failed 3 times; last: team-a/head-0: CRI ExecSync: UNAVAILABLE"
    join = result.outcomes["worker-join"]
    assert (join.state, join.attempts, join.message) == (State.SKIPPED, 0, "upstream head-start Failed")
    assert len(executor.calls) == 3


async def test_a_pod_that_never_becomes_ready_times_out_clearly(
    store: MemoryStore, clock: ManualClock
) -> None:
    await _put(store, pod("coord", "coordinator"))
    await _put(store, pod("w-0", "worker"))
    await _put(store, pod("w-1", "worker", ready=False))
    executor = FakeExecutor()

    async def during(task: asyncio.Task[RunResult]) -> None:
        await _until(task.done, clock, 1.0)

    policy = RetryPolicy(ready_timeout_seconds=30)
    result = await _run(store, clock, "mpi", executor, replicas={"worker": 2}, policy=policy, during=during)
    out = result.outcomes["mpirun"]
    assert out.state is State.TIMED_OUT and out.attempts == 0
    assert (
        out.message
        == "preconditions unmet after 30 s: ready worker: 1/2 ready (team-a/w-1: ContainersNotReady)"
    )
    assert executor.calls == []
    assert result.steps[-1].event == "TimedOut"


async def test_steps_are_idempotent_across_runs(store: MemoryStore, clock: ManualClock) -> None:
    await _put(store, pod("head-0", "head", port=6379))
    await _put(store, pod("w-0", "worker"))
    await _put(store, pod("w-1", "worker"))
    first = await _run(store, clock, "ray", FakeExecutor(), replicas={"worker": 2})
    assert first.ok and len(first.done) == 3
    # w-1 is replaced (new UID) after a reclaim: only it runs worker-join again.
    await store.delete(Kind.POD, "w-1", namespace=NS)
    await _put(store, pod("w-1", "worker", uid="uid-w-1-new"))
    executor = FakeExecutor()
    second = await _run(store, clock, "ray", executor, replicas={"worker": 2}, done=first.done)
    assert second.ok
    assert [c[0] for c in executor.calls] == ["w-1"]
    assert [(s.command, s.pod) for s in second.steps if s.event == "skip-done"] == [
        ("head-start", "team-a/head-0"),
        ("worker-join", "team-a/w-0"),
    ]


async def test_a_retry_reruns_only_the_pods_that_failed(store: MemoryStore, clock: ManualClock) -> None:
    await _put(store, pod("head-0", "head", port=6379))
    await _put(store, pod("w-0", "worker"))
    await _put(store, pod("w-1", "worker"))
    failed_once: set[str] = set()

    def flaky(p: PodState, argv: Sequence[str]) -> ExecResult:
        if p.name == "w-1" and p.name not in failed_once:
            failed_once.add(p.name)
            return ExecResult(1, stderr=b"Unable to connect to GCS")
        return ExecResult(0)

    executor = FakeExecutor(flaky)

    async def during(task: asyncio.Task[RunResult]) -> None:
        await _until(task.done, clock, 0.5)

    result = await _run(store, clock, "ray", executor, replicas={"worker": 2}, during=during)
    assert result.ok and result.outcomes["worker-join"].attempts == 2
    assert [c[0] for c in executor.calls] == ["head-0", "w-0", "w-1", "w-1"]
