"""Condition-driven command execution (WeFlex §3.4): run a profile's DAG for one job.

A command becomes eligible when every upstream command (``completed:`` preconditions, via
``graphlib``) succeeded. It then waits until its other preconditions hold in the *latest*
readiness snapshot (:func:`extender.orchestrator.dag.unmet`), and executes in every pod of its
role through an :class:`~extender.orchestrator.executors.Executor`, concurrently, with the
placeholders filled from that snapshot.

- **Idempotent steps.** A step is (command, pod UID). One that succeeded — in this run or in
  an earlier run whose ``done`` set is passed back in — is never executed again; a retry only
  re-runs the pods that failed. A replaced pod (new UID) runs the command again.
- **Bounded retries.** A failed attempt (non-zero exit or :class:`~flexlease.errors.ExecError`)
  waits the back-off (``RetryPolicy.backoff``, bounded exponential, on the injected clock),
  re-checks the preconditions on the latest snapshot, and tries again, at most
  ``max_attempts`` times; then the command is ``Failed``.
- **Timeout.** Preconditions that do not hold within ``ready_timeout_seconds`` (clock time)
  end the command ``TimedOut`` with what was still unmet (``ready worker: 1/2 ready
  (ns/w-1: ContainersNotReady)``).
- **Step log and final states.** Every transition is a :class:`Step` (also logged with
  key=value context); every command ends ``Succeeded``, ``Failed``, ``TimedOut`` or
  ``Skipped`` (an upstream command did not succeed).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from extender.orchestrator import dag as dagmod
from extender.orchestrator import template
from extender.orchestrator.dag import Dag
from extender.orchestrator.executors import Executor
from extender.orchestrator.profile import Command
from extender.orchestrator.snapshot import PodState, Snapshot
from flexlease.clock import Clock
from flexlease.errors import ExecError
from flexlease.logging import ctx
from flexlease.store.informer import Backoff

log = logging.getLogger(__name__)

_OUTPUT_IN_LOG = 400
"""Characters of a failed execution's stderr (else stdout) kept in its step message."""


_DEFAULT_BACKOFF = Backoff(initial=1.0, maximum=30.0, factor=2.0, jitter=0.0)


class State(enum.StrEnum):
    """A command's state; the last four are final."""

    PENDING = "Pending"
    WAITING = "Waiting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    SKIPPED = "Skipped"


@dataclass(frozen=True, slots=True)
class JobRef:
    """The job being orchestrated: its namespace, its ``flexlease.io/owner`` label value, and
    the expected pod count per role (a role not named: at least one pod, all of them)."""

    namespace: str
    owner: str
    replicas: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``max_attempts`` executions per command (≥ 1); ``backoff`` between them (the n-th
    failure waits ``min(maximum, initial·factor^(n-1))`` s, ± jitter); preconditions must hold
    within ``ready_timeout_seconds`` of each wait's start."""

    max_attempts: int = 5
    backoff: Backoff = field(
        default_factory=lambda: Backoff(initial=1.0, maximum=30.0, factor=2.0, jitter=0.0)
    )
    ready_timeout_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.ready_timeout_seconds <= 0:
            raise ValueError("max_attempts must be >= 1 and ready_timeout_seconds > 0")


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of the per-step log. ``event``: ``waiting`` (preconditions unmet),
    ``exec`` (started in ``pod``), ``exited`` (``exit_code``), ``exec-error``, ``skip-done``
    (idempotent: already succeeded on that pod), ``backoff``, or a final state name."""

    at: datetime
    command: str
    event: str
    attempt: int = 0
    pod: str | None = None
    exit_code: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A command's final state, executions attempted, and why (for the operator)."""

    command: str
    state: State
    attempts: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class RunResult:
    """Final state per command (in DAG order), the step log, and the succeeded steps
    ``(command, pod uid)`` to pass to the next run of the same job."""

    outcomes: Mapping[str, Outcome]
    steps: tuple[Step, ...]
    done: frozenset[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return all(o.state is State.SUCCEEDED for o in self.outcomes.values())


class SnapshotSource(Protocol):
    """Where the runner reads readiness (:class:`extender.orchestrator.watch.ReadinessWatch`)."""

    def latest(self) -> Snapshot: ...

    async def wait_newer(self, version: int, *, clock: Clock, within: float | None) -> Snapshot: ...


class Runner:
    """Runs a DAG for one job (see the module docstring). Stateless between runs except what
    is passed in; one :meth:`run` per scaling event."""

    def __init__(
        self,
        dag: Dag,
        *,
        executor: Executor,
        snapshots: SnapshotSource,
        clock: Clock,
        policy: RetryPolicy = RetryPolicy(),
        on_done: Callable[[str, str], None] | None = None,
    ) -> None:
        self._dag = dag
        self._executor = executor
        self._snapshots = snapshots
        self._clock = clock
        self._policy = policy
        self._on_done = on_done
        """Called with (command, pod uid) as each step succeeds, so a caller can record progress
        before the run ends (and resume a run cut short, passing the steps back as ``done``)."""

    async def run(self, job: JobRef, *, done: frozenset[tuple[str, str]] = frozenset()) -> RunResult:
        """Execute every command in dependency order; return when each has a final state.
        ``done``: steps that succeeded in an earlier run (not executed again)."""
        run = _Run(self, job, set(done))
        await run.execute()
        outcomes = {name: run.outcomes[name] for name in self._dag.order}
        return RunResult(outcomes=outcomes, steps=tuple(run.steps), done=frozenset(run.done))


class _Run:
    """The state of one :meth:`Runner.run`."""

    def __init__(self, runner: Runner, job: JobRef, done: set[tuple[str, str]]) -> None:
        self.r = runner
        self.job = job
        self.done = done
        self.steps: list[Step] = []
        self.outcomes: dict[str, Outcome] = {}

    async def execute(self) -> None:
        sorter = self.r._dag.sorter()
        finished: asyncio.Queue[str] = asyncio.Queue()
        active = 0
        async with asyncio.TaskGroup() as group:
            while True:
                for name in sorted(sorter.get_ready(), key=self.r._dag.order.index):
                    active += 1
                    group.create_task(
                        self._command(name, finished), name=f"orchestrate/{self.job.owner}/{name}"
                    )
                if not active:
                    break
                name = await finished.get()
                active -= 1
                if self.outcomes[name].state is State.SUCCEEDED:
                    sorter.done(name)
                else:
                    for below in sorted(self.r._dag.descendants(name), key=self.r._dag.order.index):
                        if below not in self.outcomes:
                            self._final(
                                below, State.SKIPPED, 0, f"upstream {name} {self.outcomes[name].state}"
                            )
        for name in self.r._dag.order:  # unreachable: every command is either run or skipped
            if name not in self.outcomes:
                self._final(name, State.SKIPPED, 0, "never became eligible")

    async def _command(self, name: str, finished: asyncio.Queue[str]) -> None:
        try:
            state, attempts, message = await self._attempts(self.r._dag.profile.command(name))
            self._final(name, state, attempts, message)
        finally:
            finished.put_nowait(name)

    async def _attempts(self, cmd: Command) -> tuple[State, int, str]:
        policy = self.r._policy
        attempt = 0
        last_failure = ""
        while True:
            snapshot, unmet = await self._wait_preconditions(cmd, attempt + 1)
            if unmet:
                return (
                    State.TIMED_OUT,
                    attempt,
                    (
                        f"preconditions unmet after {policy.ready_timeout_seconds:g} s: {'; '.join(unmet)}"
                        + (f" (last failure: {last_failure})" if last_failure else "")
                    ),
                )
            attempt += 1
            failures = await self._exec_all(cmd, snapshot, attempt)
            if not failures:
                return State.SUCCEEDED, attempt, ""
            last_failure = "; ".join(failures)
            if attempt >= policy.max_attempts:
                return State.FAILED, attempt, f"failed {attempt} times; last: {last_failure}"
            delay = policy.backoff.delay(attempt)
            self._step(cmd.name, "backoff", attempt, message=f"retry in {delay:g} s")
            await self.r._clock.wait(asyncio.Event(), delay)

    async def _wait_preconditions(self, cmd: Command, attempt: int) -> tuple[Snapshot, list[str]]:
        """The latest snapshot and what is unmet in it: empty once the preconditions hold,
        non-empty when the ready timeout passed first."""
        clock = self.r._clock
        deadline = clock.now() + self.r._policy.ready_timeout_seconds
        snapshot = self.r._snapshots.latest()
        reported: list[str] | None = None
        while True:
            unmet = dagmod.unmet(cmd, snapshot, self.job.replicas)
            if not unmet:
                return snapshot, []
            if unmet != reported:
                self._step(cmd.name, "waiting", attempt, message="; ".join(unmet))
                reported = unmet
            remaining = deadline - clock.now()
            if remaining <= 0:
                return snapshot, unmet
            snapshot = await self.r._snapshots.wait_newer(snapshot.version, clock=clock, within=remaining)

    async def _exec_all(self, cmd: Command, snapshot: Snapshot, attempt: int) -> list[str]:
        targets = snapshot.role(cmd.role)
        todo: list[PodState] = []
        for pod in targets:
            if (cmd.name, pod.uid) in self.done:
                self._step(
                    cmd.name, "skip-done", attempt, pod=pod.key, message="already succeeded on this pod"
                )
            else:
                todo.append(pod)
        results = await asyncio.gather(*(self._exec_one(cmd, snapshot, pod, attempt) for pod in todo))
        return [r for r in results if r]

    async def _exec_one(self, cmd: Command, snapshot: Snapshot, pod: PodState, attempt: int) -> str:
        """Execute on one pod; '' on success, else a one-line reason."""
        try:
            argv = template.render(cmd.run, pods=snapshot.pods, self_pod=pod)
        except ValueError as exc:
            self._step(cmd.name, "exec-error", attempt, pod=pod.key, message=str(exc))
            return f"{pod.key}: {exc}"
        self._step(cmd.name, "exec", attempt, pod=pod.key, message=" ".join(argv))
        try:
            result = await self.r._executor.exec(pod, argv, timeout_seconds=cmd.timeout_seconds)
        except ExecError as exc:
            self._step(cmd.name, "exec-error", attempt, pod=pod.key, message=str(exc))
            return f"{pod.key}: {exc}"
        if result.exit_code == 0:
            self.done.add((cmd.name, pod.uid))
            self._step(cmd.name, "exited", attempt, pod=pod.key, exit_code=0)
            if self.r._on_done is not None:
                self.r._on_done(cmd.name, pod.uid)
            return ""
        output = (result.stderr or result.stdout).decode(errors="replace").strip()[-_OUTPUT_IN_LOG:]
        self._step(cmd.name, "exited", attempt, pod=pod.key, exit_code=result.exit_code, message=output)
        return f"{pod.key}: exit {result.exit_code}" + (f": {output.splitlines()[-1]}" if output else "")

    def _final(self, name: str, state: State, attempts: int, message: str) -> None:
        self.outcomes[name] = Outcome(command=name, state=state, attempts=attempts, message=message)
        self._step(name, str(state), attempts, message=message)

    def _step(
        self,
        command: str,
        event: str,
        attempt: int,
        *,
        pod: str | None = None,
        exit_code: int | None = None,
        message: str = "",
    ) -> None:
        step = Step(
            at=self.r._clock.now_utc(),
            command=command,
            event=event,
            attempt=attempt,
            pod=pod,
            exit_code=exit_code,
            message=message,
        )
        self.steps.append(step)
        level = logging.WARNING if event in (State.FAILED, State.TIMED_OUT, "exec-error") else logging.INFO
        log.log(
            level,
            "orchestrator step",
            extra=ctx(
                job=self.job.owner,
                command=command,
                event=event,
                attempt=attempt,
                pod=pod,
                exit_code=exit_code,
                detail=message or None,
            ),
        )
