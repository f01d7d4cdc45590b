"""WeFlex Table 1 on real containerd: launch commands issued naively by the platform vs through
the topology-aware orchestrator, for MPI, PyTorch, Ray and TensorFlow.

Each trial runs one job on the containerd testbed (``hack/containerd-testbed.sh``): a
coordinator pod (MPI coordinator, PyTorch master, Ray head, TF chief) and ``workers`` worker
pods, each a host-network sandbox with one container of the framework stand-in image
(``hack/orchestrator/standins``, built by ``containerd-testbed.sh framework-image``). Every
pod's agent comes up after a random boot delay (seeded: same seed, same delays) and listens on
its own 127.0.0.1 port; a stand-in kubelet (this module) reports the pods Running once their
containers started and Ready once a TCP probe of that port succeeds, in a MemoryStore.

* **naive**: as soon as the pods run, the platform executes every command of the profile in
  every pod of its role at once (CRI ExecSync), blind to readiness;
* **orchestrated**: :class:`extender.orchestrator.runner.Runner` runs the profile's DAG from the
  readiness snapshot, through the same executor.

The stand-in launchers fail as the real ones do when started too early (``mpirun`` cannot
reach a worker's daemon; a Ray or torchrun worker finds no head/rendezvous store); the TF
start script waits for its peers itself. The profiles used are the stand-in twins in
``hack/orchestrator/profiles`` (user profiles), which must have the shipped profiles' roles,
commands and preconditions (checked); only the argv differs (endpoints instead of hosts).

Run: ``sudo python -m hack.table1 --trials 20`` (starts and stops its own testbed, or
``--testbed DIR`` to use a running one). Prints the failure-rate table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from extender.orchestrator import dag, profile, template
from extender.orchestrator.executors import CriExecutor
from extender.orchestrator.profile import Profile
from extender.orchestrator.runner import JobRef, RetryPolicy, Runner
from extender.orchestrator.snapshot import PodState, pod_state
from extender.orchestrator.watch import ReadinessWatch
from flexlease import errors, tasks
from flexlease.api import keys
from flexlease.api.pod import owner_label_value
from flexlease.clock import SystemClock
from flexlease.cri import api_pb2
from flexlease.errors import ExecError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from nodeagent.cri import podspec
from nodeagent.cri.client import GrpcCri

REPO: Final = Path(__file__).resolve().parents[1]
SCRIPT: Final = REPO / "hack" / "containerd-testbed.sh"
PROFILE_DIR: Final = REPO / "hack" / "orchestrator" / "profiles"
NAMESPACE: Final = "table1"
FRAMEWORKS: Final = ("mpi", "pytorch", "ray", "tensorflow")
COORDINATOR: Final = {"mpi": "coordinator", "pytorch": "master", "ray": "head", "tensorflow": "chief"}
LAUNCHER: Final = {"mpi": "mpirun", "pytorch": "torchrun", "ray": "ray start", "tensorflow": "start script"}
PAPER: Final = {"mpi": (95, 0), "pytorch": (97, 0), "ray": (92, 0), "tensorflow": (0, 0)}
"""WeFlex Table 1, failure rates in percent: (original, topology-aware)."""
PROBE_PERIOD_S: Final = 0.2
MODES: Final = ("naive", "orchestrated")
"""The launch modes of a trial, in the order a schedule runs them on the same delays."""


@dataclass(frozen=True)
class Testbed:
    """What the harness needs of a running containerd testbed."""

    dir: Path
    endpoint: str
    cgroup_parent: str
    image: str

    @property
    def log_root(self) -> Path:
        return self.dir / "pod-logs"


def testbed_script(cmd: str, directory: Path) -> dict[str, str]:
    """Run ``containerd-testbed.sh cmd directory``; the ``KEY=value`` lines it prints."""
    proc = subprocess.run(
        [str(SCRIPT), cmd, str(directory)], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"{SCRIPT.name} {cmd} {directory} failed (exit {proc.returncode}):\n{tail}")
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def prepare(directory: Path) -> Testbed:
    """Build and load the framework image into the testbed in ``directory`` (idempotent)."""
    env = testbed_script("env", directory)
    env.update(testbed_script("framework-image", directory))
    return Testbed(
        dir=directory,
        endpoint=env["FLEXLEASE_CRI_ENDPOINT"],
        cgroup_parent=env["FLEXLEASE_TESTBED_CGROUP_PARENT"],
        image=env["FLEXLEASE_TESTBED_FRAMEWORK_IMAGE"],
    )


def profiles() -> dict[str, Profile]:
    """The stand-in profiles, checked to have the shipped profiles' dependency structure."""
    return twin_profiles(PROFILE_DIR, FRAMEWORKS)


def twin_profiles(directory: Path, names: Sequence[str]) -> dict[str, Profile]:
    """The profiles in ``directory``; each of ``names`` must have the shipped profile's roles,
    commands and preconditions (only the argv may differ). Raises ``RuntimeError`` otherwise."""
    shipped = profile.builtin()
    twins = profile.load_dir(directory)
    for name in names:
        a, b = shipped[name], twins.get(name)
        shape_a = [(c.name, c.role, c.preconditions) for c in a.commands]
        shape_b = [(c.name, c.role, c.preconditions) for c in b.commands] if b else None
        if b is None or shape_a != shape_b or a.roles != b.roles:
            raise RuntimeError(f"{directory / name}.yaml differs from the shipped {name} profile")
    return twins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pod:
    """One pod of a trial: its Kubernetes object (in the store) and its sandbox."""

    name: str
    role: str
    port: int
    boot_delay: float
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    sandbox_id: str = ""
    container_id: str = ""


@dataclass(frozen=True)
class TrialResult:
    framework: str
    mode: str
    ok: bool
    seconds: float
    attempts: int
    message: str


class PodRef(Protocol):
    """What :func:`pod_object` reads of a trial's pod (this module's and the real launchers')."""

    name: str
    role: str
    port: int


def pod_object(
    pod: PodRef, *, framework: str, owner: str, namespace: str = NAMESPACE, image: str = "framework"
) -> dict[str, Any]:
    """The Pod JSON the platform would hold for ``pod`` in ``namespace``: host network, one
    container ``main`` running ``image`` with the pod's port."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "labels": {
                keys.LABEL_OWNER: owner_label_value(owner),
                keys.LABEL_ROLE: pod.role,
                keys.LABEL_FRAMEWORK: framework,
            },
        },
        "spec": {
            "hostNetwork": True,
            "containers": [{"name": "main", "image": image, "ports": [{"containerPort": pod.port}]}],
        },
    }


def running_status(pod: Pod, *, ready: bool) -> dict[str, Any]:
    """``status`` as kubelet writes it for a started container, Ready or not yet."""
    return {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "hostIP": "127.0.0.1",
        "conditions": [
            {"type": "Ready", "status": "True"}
            if ready
            else {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
        ],
        "containerStatuses": [
            {
                "name": "main",
                "ready": ready,
                "containerID": f"containerd://{pod.container_id}",
                "state": {"running": {"startedAt": "1970-01-01T00:00:00Z"}},
            }
        ],
    }


class Trial:
    """One job on the testbed: creates its pods, plays kubelet for them, removes them."""

    def __init__(
        self, cri: GrpcCri, testbed: Testbed, store: MemoryStore, *, framework: str, index: int
    ) -> None:
        self.cri = cri
        self.testbed = testbed
        self.store = store
        self.framework = framework
        self.owner = f"{NAMESPACE}/{framework}-{index}"
        self.prefix = f"{framework}-{index}"

    @contextlib.asynccontextmanager
    async def pods(self, delays: dict[str, list[float]]) -> AsyncIterator[list[Pod]]:
        """Start the pods (``delays``: boot delay in seconds per pod, by role) and their probes;
        stop and remove everything on exit."""
        pods = [
            Pod(name=f"{self.prefix}-{role}-{i}", role=role, port=free_port(), boot_delay=delay)
            for role, role_delays in delays.items()
            for i, delay in enumerate(role_delays)
        ]
        probes: list[asyncio.Task[None]] = []
        try:
            for pod in pods:
                created = await self.store.create(
                    Kind.POD, pod_object(pod, framework=self.framework, owner=self.owner)
                )
                pod.uid = created["metadata"]["uid"]
            await asyncio.gather(*(self._start(pod) for pod in pods))
            for pod in pods:
                probes.append(asyncio.create_task(self._probe(pod), name=f"table1-probe/{pod.name}"))
            yield pods
        finally:
            await tasks.stop(*probes)
            await asyncio.gather(*(self._remove(pod) for pod in pods))

    async def _start(self, pod: Pod) -> None:
        ref = podspec.PodRef(namespace=NAMESPACE, name=pod.name, uid=pod.uid)
        config = podspec.sandbox_config(ref, self.testbed.log_root, cgroup_parent=self.testbed.cgroup_parent)
        config.linux.security_context.namespace_options.network = api_pb2.NODE  # hostNetwork: true
        config.hostname = ""  # kubelet sets no hostname for host-network pods
        pod.sandbox_id = await self.cri.run_pod_sandbox(config)
        env = {"PORT": str(pod.port), "BOOT_DELAY": f"{pod.boot_delay:.2f}", "ROLE": pod.role}
        spec = podspec.ContainerSpec(name="main", image=self.testbed.image, env=env)
        pod.container_id = await self.cri.create_container(
            pod.sandbox_id, podspec.container_config(ref, spec), config
        )
        await self.cri.start_container(pod.container_id)
        await self._status(pod, ready=False)

    async def _status(self, pod: Pod, *, ready: bool) -> None:
        await self.store.patch(
            Kind.POD,
            pod.name,
            {"status": running_status(pod, ready=ready)},
            namespace=NAMESPACE,
            subresource="status",
        )

    async def _probe(self, pod: Pod) -> None:
        """kubelet's tcpSocket readiness probe, every PROBE_PERIOD_S, until it first succeeds."""
        while True:
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", pod.port)
            except OSError:
                await asyncio.sleep(PROBE_PERIOD_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            await self._status(pod, ready=True)
            return

    async def _remove(self, pod: Pod) -> None:
        with contextlib.suppress(errors.CriNotFound):
            if pod.sandbox_id:
                await self.cri.stop_pod_sandbox(pod.sandbox_id)
                await self.cri.remove_pod_sandbox(pod.sandbox_id)
        with contextlib.suppress(errors.NotFound):
            await self.store.delete(Kind.POD, pod.name, namespace=NAMESPACE)

    async def states(self) -> dict[str, tuple[PodState, ...]]:
        """The job's pods as the platform sees them now, by role (sorted by name)."""
        listed = await self.store.list(Kind.POD, namespace=NAMESPACE)
        by_role: dict[str, list[PodState]] = {}
        for obj in listed.items:
            if obj["metadata"]["labels"].get(keys.LABEL_OWNER) == owner_label_value(self.owner):
                state = pod_state(obj)
                by_role.setdefault(state.role, []).append(state)
        return {r: tuple(sorted(v, key=lambda s: s.name)) for r, v in by_role.items()}


async def launch_naive(trial: Trial, prof: Profile, executor: CriExecutor) -> tuple[bool, int, str]:
    """Every command of the profile, in every pod of its role, all at once, right away."""
    pods = await trial.states()

    async def one(cmd: profile.Command, pod: PodState) -> str:
        argv = template.render(cmd.run, pods=pods, self_pod=pod)
        try:
            result = await executor.exec(pod, argv, timeout_seconds=cmd.timeout_seconds)
        except ExecError as exc:
            return f"{cmd.name} in {pod.name}: {exc}"
        if result.exit_code:
            return f"{cmd.name} in {pod.name}: {result.stderr.decode(errors='replace').strip()}"
        return ""

    calls = [one(cmd, pod) for cmd in prof.commands for pod in pods.get(cmd.role, ())]
    failures = [f for f in await asyncio.gather(*calls) if f]
    return not failures, len(calls), failures[0] if failures else ""


async def launch_orchestrated(
    trial: Trial, prof: Profile, executor: CriExecutor, workers: int
) -> tuple[bool, int, str]:
    """The profile's DAG through the runner, from the readiness snapshot."""
    watch = ReadinessWatch(trial.store, namespace=NAMESPACE, owner=trial.owner, roles=prof.roles)
    async with watch.running():
        runner = Runner(
            dag.build(prof),
            executor=executor,
            snapshots=watch,
            clock=SystemClock(),
            policy=RetryPolicy(max_attempts=3, ready_timeout_seconds=60),
        )
        result = await runner.run(
            JobRef(NAMESPACE, trial.owner, {"worker": workers, COORDINATOR[prof.name]: 1})
        )
    execs = sum(1 for s in result.steps if s.event == "exec")
    bad = next((o for o in result.outcomes.values() if o.state != "Succeeded"), None)
    return result.ok, execs, "" if bad is None else f"{bad.command} {bad.state}: {bad.message}"


def boot_delays(
    rng: random.Random, framework: str, workers: int, low: float, high: float
) -> dict[str, list[float]]:
    """Boot (or container start) delays, uniform in [low, high] s: the coordinator's first,
    then ``workers`` workers'."""
    return {
        COORDINATOR[framework]: [round(rng.uniform(low, high), 2)],
        "worker": [round(rng.uniform(low, high), 2) for _ in range(workers)],
    }


async def run_trial(
    cri: GrpcCri,
    testbed: Testbed,
    store: MemoryStore,
    executor: CriExecutor,
    *,
    prof: Profile,
    mode: str,
    index: int,
    delays: dict[str, list[float]],
) -> TrialResult:
    """One job, launched ``naive`` or ``orchestrated``."""
    trial = Trial(cri, testbed, store, framework=prof.name, index=index)
    workers = len(delays["worker"])
    async with trial.pods(delays):
        started = time.perf_counter()
        if mode == "naive":
            ok, execs, message = await launch_naive(trial, prof, executor)
        else:
            ok, execs, message = await launch_orchestrated(trial, prof, executor, workers)
        seconds = time.perf_counter() - started
    return TrialResult(prof.name, mode, ok, seconds, execs, message)


async def run_table(
    testbed: Testbed, *, trials: int, workers: int, seed: int, low: float, high: float, progress: bool = True
) -> list[TrialResult]:
    """``trials`` jobs per framework and mode, alternating modes so both see the same load
    (:func:`run_schedule`)."""
    return await run_schedule(
        run_trial,
        testbed,
        profiles=profiles(),
        frameworks=FRAMEWORKS,
        workers=dict.fromkeys(FRAMEWORKS, workers),
        trials=trials,
        seed=seed,
        low=low,
        high=high,
        cri_timeout_seconds=30,
        line=_line if progress else None,
    )


class HasEndpoint(Protocol):
    @property
    def endpoint(self) -> str:
        """The testbed's CRI endpoint (``unix:///...``)."""
        ...


TestbedT = TypeVar("TestbedT", bound=HasEndpoint)
TestbedT_contra = TypeVar("TestbedT_contra", bound=HasEndpoint, contravariant=True)
ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)


class RunTrial(Protocol[TestbedT_contra, ResultT_co]):
    """One trial of a harness (this module's :func:`run_trial`, the real launchers')."""

    def __call__(
        self,
        cri: GrpcCri,
        testbed: TestbedT_contra,
        store: MemoryStore,
        executor: CriExecutor,
        *,
        prof: Profile,
        mode: str,
        index: int,
        delays: dict[str, list[float]],
    ) -> Awaitable[ResultT_co]: ...


async def run_schedule(
    trial: RunTrial[TestbedT, ResultT],
    testbed: TestbedT,
    *,
    profiles: Mapping[str, Profile],
    frameworks: Sequence[str],
    workers: Mapping[str, int],
    trials: int,
    seed: int,
    low: float,
    high: float,
    cri_timeout_seconds: float,
    line: Callable[[ResultT], str] | None,
) -> list[ResultT]:
    """The trial schedule of both Table 1 harnesses: ``trials`` rounds; in each, for every
    framework in ``frameworks``, one draw of :func:`boot_delays` (``workers[framework]``
    workers, uniform in [low, high] s, from one ``random.Random(seed)``: same seed, same
    delays) and then one ``trial`` per mode of :data:`MODES` on those same delays, so both
    modes see the same load. Trials are numbered from 0 in the order they run; one
    MemoryStore, CRI client (``cri_timeout_seconds`` per call) and executor serve them all.
    ``line(result)`` is printed to stderr after each trial when given. Returns the results in
    that order; an exception from a trial propagates."""
    rng = random.Random(seed)
    results: list[ResultT] = []
    store = MemoryStore()
    try:
        async with (
            GrpcCri(testbed.endpoint, timeout_seconds=cri_timeout_seconds) as cri,
            CriExecutor(testbed.endpoint) as executor,
        ):
            for index in range(trials):
                for name in frameworks:
                    delays = boot_delays(rng, name, workers[name], low, high)
                    for mode in MODES:
                        r = await trial(
                            cri,
                            testbed,
                            store,
                            executor,
                            prof=profiles[name],
                            mode=mode,
                            index=len(results),
                            delays=delays,
                        )
                        results.append(r)
                        if line is not None:
                            print(f"trial {index + 1}/{trials} {line(r)}", file=sys.stderr, flush=True)
    finally:
        await store.close()
    return results


def _line(r: TrialResult) -> str:
    mark = "ok" if r.ok else "FAILED"
    return f"{r.framework:<10} {r.mode:<12} {mark:<6} {r.seconds:5.2f} s {r.message[:90]}"


def format_table(results: Sequence[TrialResult]) -> str:
    """The failure-rate table, next to the paper's figures."""
    lines = [
        f"{'framework':<11} {'command':<13} {'naive failed':>14} {'orchestrated failed':>20} "
        f"{'orchestrated launch':>20}   paper (naive / topology-aware)",
    ]
    for name in FRAMEWORKS:
        naive = [r for r in results if r.framework == name and r.mode == "naive"]
        orch = [r for r in results if r.framework == name and r.mode == "orchestrated"]
        if not naive:
            continue

        def rate(rs: list[TrialResult]) -> str:
            failed = sum(not r.ok for r in rs)
            return f"{failed}/{len(rs)} ({100 * failed / len(rs):.0f} %)"

        median = sorted(r.seconds for r in orch)[len(orch) // 2] if orch else 0.0
        paper = PAPER[name]
        lines.append(
            f"{name:<11} {LAUNCHER[name]:<13} {rate(naive):>14} {rate(orch):>20} "
            f"{f'{median:.2f} s median':>20}   {paper[0]} % / {paper[1]} %"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def own_testbed() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="flexlease-table1-", dir="/tmp"))
    try:
        testbed_script("start", directory)
        yield directory
    finally:
        testbed_script("stop", directory)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=20, help="jobs per framework and mode (default 20)")
    parser.add_argument("--workers", type=int, default=3, help="worker pods per job (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the boot delays (default 1)")
    parser.add_argument(
        "--boot",
        type=float,
        nargs=2,
        default=(0.2, 3.0),
        metavar=("LOW", "HIGH"),
        help="pods' boot delays are uniform in [LOW, HIGH] seconds (default 0.2 3.0)",
    )
    parser.add_argument("--testbed", type=Path, help="a running testbed's directory (default: start one)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (containerd)")
    with contextlib.ExitStack() as stack:
        directory = args.testbed or stack.enter_context(own_testbed())
        testbed = prepare(directory)
        started = time.perf_counter()
        results = asyncio.run(
            run_table(
                testbed,
                trials=args.trials,
                workers=args.workers,
                seed=args.seed,
                low=args.boot[0],
                high=args.boot[1],
            )
        )
        print(format_table(results))
        print(
            f"({args.trials} jobs per framework and mode, 1 coordinator + {args.workers} workers each, boot "
            f"delays U[{args.boot[0]:g}, {args.boot[1]:g}] s, seed {args.seed}; "
            f"{time.perf_counter() - started:.0f} s; {os.cpu_count()}-core {os.uname().machine})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
