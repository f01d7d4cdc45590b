"""The real launchers under the orchestrator on real containerd (issue #14, WeFlex §3.4): Open
MPI's ``mpirun`` with mpi4py ranks, and Ray's ``ray start --head`` / ``ray start --address``,
each launched naively by the platform and through the topology-aware orchestrator.

Every pod is a host-network CRI sandbox on the containerd testbed (``hack/containerd-testbed.sh``)
with one container of the launcher image (``containerd-testbed.sh launcher-image``: an empty
merged-/usr root) into which the host's ``/usr``, ``/etc`` and Python are bind-mounted
read-only (CRI ``Mount``), so ``mpirun``, ``orted``, mpi4py and Ray run exactly as installed on
the host (Debian ``openmpi-bin``; ``mpi4py`` and ``ray`` from PyPI), and ``hack/launchers/app``
is ``/app``. Each pod listens on its own ports; Ray pods each get their own loopback address
(``127.0.0.<n>``, :data:`RAY_IP_BASE`), because Ray replaces ``127.0.0.1`` in ``--address`` by
the machine's outward address, and traffic stays on 127.0.0.0/8.

Pods come up like a cluster's: every sandbox runs at once, but each pod's container starts
only after its own random delay (image pull, volume set-up; seeded). A stand-in kubelet (this
module) reports a pod Running when its container started, and Ready then too, except Ray's head,
which is Ready once a TCP probe of its GCS port succeeds (KubeRay's readiness).

* **MPI**: the coordinator runs ``mpirun --host <worker pod names>``; Open MPI starts its
  ``orted`` in each worker pod through ``/app/cri-rsh`` (``OMPI_MCA_plm_rsh_agent``), which
  execs into the pod by name through containerd (``ctr tasks exec`` on the testbed's socket,
  mounted into the coordinator pod) — the MPI Operator's ``kubectl exec`` agent, on CRI. A
  worker whose container is not running yet fails the launch: ``ORTE was unable to reliably
  start one or more daemons``. The ranks run ``/app/mpi_allreduce.py`` (mpi4py allreduce).
* **Ray**: ``ray start --head`` on the head, ``ray start --address=<head>`` on the workers,
  then a driver (``/app/ray_nodes.py``, run in the head pod) checks that every node joined and
  runs a task. A worker that finds no GCS fails (``Failed to connect to GCS``) once its budget
  is spent: Ray's own ``gcs_server_port_wait_time_s`` attempts of ``py_gcs_connect_timeout_s``
  each, set in the pods' environment (:data:`RAY_JOIN_BUDGET`); Ray's default budget is 20
  attempts of 30 s, which only makes a naive trial slower to fail.

Modes: **naive** — the platform runs each command in each pod of its role as soon as that pod's
container runs (what a container's own command does), all at once; the first failure ends the
launch. **orchestrated** — :class:`extender.orchestrator.runner.Runner` runs the profile's DAG
from the readiness snapshot (:class:`extender.orchestrator.watch.ReadinessWatch` on a
MemoryStore the stand-in kubelet writes), through CRI ExecSync. The profiles are the real-launcher
twins in ``hack/launchers/profiles``, checked to have the shipped profiles' roles, commands and
preconditions.

Run: ``sudo python -m hack.real_launchers --trials 10`` (starts and stops its own testbed, or
``--testbed DIR``). Prints naive vs orchestrated failure counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from extender.orchestrator import dag, template
from extender.orchestrator.executors import CriExecutor
from extender.orchestrator.profile import Command, Profile
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
from hack import table1
from nodeagent.cri import podspec
from nodeagent.cri.client import GrpcCri

REPO: Final = Path(__file__).resolve().parents[1]
APP_DIR: Final = REPO / "hack" / "launchers" / "app"
PROFILE_DIR: Final = REPO / "hack" / "launchers" / "profiles"
NAMESPACE: Final = "launchers"
FRAMEWORKS: Final = ("mpi", "ray")
COORDINATOR: Final = {"mpi": "coordinator", "ray": "head"}
LAUNCHER: Final = {"mpi": "mpirun", "ray": "ray start"}
RAY_IP_BASE: Final = 2
"""Ray pods get 127.0.0.2, 127.0.0.3, … in creation order (head first)."""
RAY_JOIN_BUDGET: Final = {
    "RAY_gcs_server_port_wait_time_s": "1",
    "RAY_py_gcs_connect_timeout_s": "1",
    "RAY_gcs_rpc_server_connect_timeout_s": "1",
}
"""How long ``ray start --address`` looks for the GCS before it fails: one attempt of 1 s with a
1 s connect timeout (Ray's own config, set by environment; the default is 20 attempts of 30 s)."""
FAILURE_LINES: Final = ("ORTE was unable to reliably start", "RuntimeError: Failed to connect to GCS")
"""How Open MPI and Ray say that a launch failed for want of a peer."""
CONTAINERD_SOCKET_IN_POD: Final = "/run/containerd/containerd.sock"
PROBE_PERIOD_S: Final = 0.2
DRIVER_TIMEOUT_S: Final = 120
START_TIMEOUT_S: Final = 300
"""A naive command gives up on a pod whose container has not started by then."""


@dataclass(frozen=True)
class Testbed:
    """What the harness needs of a running containerd testbed."""

    dir: Path
    endpoint: str
    cgroup_parent: str
    image: str

    @property
    def socket(self) -> Path:
        return Path(self.endpoint.removeprefix("unix://"))

    @property
    def fifo_dir(self) -> Path:
        """Where ``ctr tasks exec`` in a pod makes its exec's FIFOs (the same path in the pod)."""
        return self.dir / "launcher-fifo"


def prepare(directory: Path) -> Testbed:
    """Build and load the launcher image into the testbed in ``directory`` (idempotent)."""
    env = table1.testbed_script("env", directory)
    env.update(table1.testbed_script("launcher-image", directory))
    testbed = Testbed(
        dir=directory,
        endpoint=env["FLEXLEASE_CRI_ENDPOINT"],
        cgroup_parent=env["FLEXLEASE_TESTBED_CGROUP_PARENT"],
        image=env["FLEXLEASE_TESTBED_LAUNCHER_IMAGE"],
    )
    testbed.fifo_dir.mkdir(mode=0o700, exist_ok=True)
    return testbed


def profiles() -> dict[str, Profile]:
    """The real-launcher profiles, checked to have the shipped profiles' dependency structure."""
    return table1.twin_profiles(PROFILE_DIR, FRAMEWORKS)


def python_dirs() -> list[Path]:
    """The Python installation(s) the pods need mounted: this interpreter's prefix and base
    prefix (a virtual environment's and its base's), unless they lie under ``/usr``."""
    out: list[Path] = []
    for prefix in (sys.prefix, sys.base_prefix):
        path = Path(prefix).resolve()
        if not path.is_relative_to("/usr") and path not in out:
            out.append(path)
    return out


@dataclass
class Pod:
    """One pod of a trial: its identity, address, start delay and runtime ids."""

    name: str
    role: str
    ip: str
    port: int
    delay: float
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    sandbox_id: str = ""
    container_id: str = ""
    started: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class TrialResult:
    framework: str
    mode: str
    ok: bool
    seconds: float
    execs: int
    message: str


def pod_status(pod: Pod, *, running: bool, ready: bool) -> dict[str, Any]:
    """``status`` as kubelet writes it: Pending (ContainerCreating) or Running, Ready or not."""
    status: dict[str, Any] = {
        "phase": "Running" if running else "Pending",
        "podIP": pod.ip,
        "hostIP": "127.0.0.1",
        "conditions": [
            {"type": "Ready", "status": "True"}
            if ready
            else {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}
        ],
    }
    if running:
        status["containerStatuses"] = [
            {
                "name": "main",
                "ready": ready,
                "containerID": f"containerd://{pod.container_id}",
                "state": {"running": {"startedAt": "1970-01-01T00:00:00Z"}},
            }
        ]
    return status


class Job:
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
        self.pods: list[Pod] = []

    @contextlib.asynccontextmanager
    async def running(self, delays: Mapping[str, Sequence[float]]) -> AsyncIterator[list[Pod]]:
        """Create the pods (``delays``: each pod's container start delay in seconds, by role;
        the coordinator's role first), run their sandboxes, and start each container after its
        delay in the background; stop and remove everything on exit."""
        self.pods = [
            Pod(
                name=f"{self.prefix}-{role}-{i}",
                role=role,
                ip=f"127.0.0.{RAY_IP_BASE + n}" if self.framework == "ray" else "127.0.0.1",
                port=table1.free_port(),
                delay=delay,
            )
            for n, (role, i, delay) in enumerate(
                (role, i, delay) for role, ds in delays.items() for i, delay in enumerate(ds)
            )
        ]
        kubelets: list[asyncio.Task[None]] = []
        try:
            for pod in self.pods:
                created = await self.store.create(
                    Kind.POD,
                    table1.pod_object(
                        pod, framework=self.framework, owner=self.owner, namespace=NAMESPACE, image="launcher"
                    ),
                )
                pod.uid = created["metadata"]["uid"]
            await asyncio.gather(*(self._create(pod) for pod in self.pods))
            kubelets = [
                asyncio.create_task(self._start(pod), name=f"launchers-kubelet/{pod.name}")
                for pod in self.pods
            ]
            yield self.pods
        finally:
            await tasks.stop(*kubelets)
            await asyncio.gather(*(self._remove(pod) for pod in self.pods))

    def _container_spec(self, pod: Pod) -> podspec.ContainerSpec:
        ro = [
            podspec.HostMount(Path("/usr"), "/usr", readonly=True),
            podspec.HostMount(Path("/etc"), "/etc", readonly=True),
            podspec.HostMount(APP_DIR, "/app", readonly=True),
            *(podspec.HostMount(p, str(p), readonly=True) for p in python_dirs()),
        ]
        env = {
            "PATH": ":".join([*(f"{p}/bin" for p in python_dirs()), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": "/root",
            "POD_NAME": pod.name,
            "POD_NAMESPACE": NAMESPACE,
        }
        if self.framework == "ray":
            env |= {"RAY_USAGE_STATS_ENABLED": "0", **RAY_JOIN_BUDGET}
        if self.framework == "mpi":
            # Open MPI's MCA parameters by environment, as the MPI Operator sets them: the rsh
            # agent, and the out-of-band and byte-transfer TCP on the loopback interface only.
            env |= {
                "OMPI_MCA_plm_rsh_agent": "/app/cri-rsh",
                "OMPI_MCA_oob_tcp_if_include": "lo",
                "OMPI_MCA_btl_tcp_if_include": "lo",
                "OMPI_MCA_btl": "self,tcp",
            }
            if pod.role == COORDINATOR["mpi"]:
                # The launcher may exec into its job's pods (the MPI Operator grants pods/exec).
                env |= {
                    "CONTAINERD_ADDRESS": CONTAINERD_SOCKET_IN_POD,
                    "FIFO_DIR": str(self.testbed.fifo_dir),
                }
                ro += [
                    podspec.HostMount(self.testbed.socket, CONTAINERD_SOCKET_IN_POD),
                    podspec.HostMount(self.testbed.fifo_dir, str(self.testbed.fifo_dir)),
                ]
        return podspec.ContainerSpec(name="main", image=self.testbed.image, env=env, mounts=tuple(ro))

    async def _create(self, pod: Pod) -> None:
        ref = podspec.PodRef(namespace=NAMESPACE, name=pod.name, uid=pod.uid)
        config = podspec.sandbox_config(
            ref, self.testbed.dir / "pod-logs", cgroup_parent=self.testbed.cgroup_parent
        )
        config.linux.security_context.namespace_options.network = api_pb2.NODE  # hostNetwork: true
        config.hostname = ""  # kubelet sets no hostname for host-network pods
        pod.sandbox_id = await self.cri.run_pod_sandbox(config)
        pod.container_id = await self.cri.create_container(
            pod.sandbox_id, podspec.container_config(ref, self._container_spec(pod)), config
        )
        await self._status(pod, running=False, ready=False)

    async def _start(self, pod: Pod) -> None:
        """After the pod's delay: start its container, report it Running (and Ready, or probe)."""
        await asyncio.sleep(pod.delay)
        await self.cri.start_container(pod.container_id)
        probed = self.framework == "ray" and pod.role == COORDINATOR["ray"]
        await self._status(pod, running=True, ready=not probed)
        pod.started.set()
        while probed:  # kubelet's tcpSocket readiness probe of the GCS port
            try:
                _reader, writer = await asyncio.open_connection(pod.ip, pod.port)
            except OSError:
                await asyncio.sleep(PROBE_PERIOD_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            await self._status(pod, running=True, ready=True)
            return

    async def _status(self, pod: Pod, *, running: bool, ready: bool) -> None:
        await self.store.patch(
            Kind.POD,
            pod.name,
            {"status": pod_status(pod, running=running, ready=ready)},
            namespace=NAMESPACE,
            subresource="status",
        )

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


class LaunchFailed(Exception):
    """A naive launch's first failed command (ends the launch)."""


async def launch_naive(job: Job, prof: Profile, executor: CriExecutor) -> tuple[bool, int, str]:
    """Each command in each pod of its role as soon as that pod's container runs, all at once;
    the first failure ends the launch (the others are abandoned, as the pods will be)."""
    execs = 0

    async def one(cmd: Command, pod: Pod) -> None:
        nonlocal execs
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await pod.started.wait()
        except TimeoutError:
            raise LaunchFailed(
                f"{cmd.name} in {pod.name}: container not started in {START_TIMEOUT_S} s"
            ) from None
        pods = await job.states()
        self_pod = next(p for p in pods[pod.role] if p.name == pod.name)
        argv = template.render(cmd.run, pods=pods, self_pod=self_pod)
        execs += 1
        try:
            result = await executor.exec(self_pod, argv, timeout_seconds=cmd.timeout_seconds)
        except ExecError as exc:
            raise LaunchFailed(f"{cmd.name} in {pod.name}: {exc}") from exc
        if result.exit_code:
            raise LaunchFailed(f"{cmd.name} in {pod.name}: exit {result.exit_code}: {reason(result.stderr)}")

    failure = ""
    try:
        async with asyncio.TaskGroup() as group:
            for cmd in prof.commands:
                for pod in job.pods:
                    if pod.role == cmd.role:
                        group.create_task(one(cmd, pod), name=f"naive/{cmd.name}/{pod.name}")
    except* LaunchFailed as failed:
        failure = str(failed.exceptions[0])
    return not failure, execs, failure


async def launch_orchestrated(job: Job, prof: Profile, executor: CriExecutor) -> tuple[bool, int, str]:
    """The profile's DAG through the runner, from the readiness snapshot."""
    replicas: dict[str, int] = {}
    for pod in job.pods:
        replicas[pod.role] = replicas.get(pod.role, 0) + 1
    watch = ReadinessWatch(job.store, namespace=NAMESPACE, owner=job.owner, roles=prof.roles)
    async with watch.running():
        runner = Runner(
            dag.build(prof),
            executor=executor,
            snapshots=watch,
            clock=SystemClock(),
            policy=RetryPolicy(max_attempts=3, ready_timeout_seconds=120),
        )
        result = await runner.run(JobRef(NAMESPACE, job.owner, replicas))
    execs = sum(1 for s in result.steps if s.event == "exec")
    bad = next((o for o in result.outcomes.values() if o.state != "Succeeded"), None)
    return result.ok, execs, "" if bad is None else f"{bad.command} {bad.state}: {bad.message}"


async def check_ray(job: Job, executor: CriExecutor) -> tuple[bool, str]:
    """Run the driver in the head pod: every node alive, a task runs. (ok, its output)."""
    pods = await job.states()
    head = pods[COORDINATOR["ray"]][0]
    nodes = sum(len(v) for v in pods.values())
    try:
        result = await executor.exec(
            head,
            ["python3", "/app/ray_nodes.py", head.endpoint, str(nodes)],
            timeout_seconds=DRIVER_TIMEOUT_S,
        )
    except ExecError as exc:
        return False, f"driver: {exc}"
    out = _tail(result.stdout if result.exit_code == 0 else result.stderr or result.stdout)
    return result.exit_code == 0, f"driver: {out}" if result.exit_code else out


async def run_trial(
    cri: GrpcCri,
    testbed: Testbed,
    store: MemoryStore,
    executor: CriExecutor,
    *,
    prof: Profile,
    mode: str,
    index: int,
    delays: Mapping[str, Sequence[float]],
) -> TrialResult:
    """One job, launched ``naive`` or ``orchestrated``; a Ray launch that succeeded is then
    checked by the driver (its failure fails the trial)."""
    job = Job(cri, testbed, store, framework=prof.name, index=index)
    async with job.running(delays):
        started = time.perf_counter()
        launch = launch_naive if mode == "naive" else launch_orchestrated
        ok, execs, message = await launch(job, prof, executor)
        if ok and prof.name == "ray":
            ok, message = await check_ray(job, executor)
        seconds = time.perf_counter() - started
    return TrialResult(prof.name, mode, ok, seconds, execs, message)


async def run_table(
    testbed: Testbed,
    *,
    trials: int,
    workers: Mapping[str, int],
    seed: int,
    low: float,
    high: float,
    frameworks: Sequence[str] = FRAMEWORKS,
    progress: bool = True,
) -> list[TrialResult]:
    """``trials`` jobs per framework and mode, modes alternating on the same container start
    delays (:func:`hack.table1.run_schedule`)."""
    return await table1.run_schedule(
        run_trial,
        testbed,
        profiles=profiles(),
        frameworks=frameworks,
        workers=workers,
        trials=trials,
        seed=seed,
        low=low,
        high=high,
        cri_timeout_seconds=60,
        line=_line if progress else None,
    )


def reason(stderr: bytes) -> str:
    """A failed launcher's diagnosis from its stderr: the first line of a known launch failure
    (:data:`FAILURE_LINES`), else its last line."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    found = next((line for line in lines if any(m in line for m in FAILURE_LINES)), None)
    return (found or (lines[-1] if lines else "no output"))[:300]


def _tail(data: bytes, lines: int = 1) -> str:
    text = data.decode(errors="replace").strip().splitlines()
    return " | ".join(line.strip() for line in text[-lines:])[:300]


def _line(r: TrialResult) -> str:
    mark = "ok" if r.ok else "FAILED"
    return f"{r.framework:<5} {r.mode:<12} {mark:<6} {r.seconds:6.2f} s {r.message[:110]}"


def format_table(results: Sequence[TrialResult]) -> str:
    """Naive vs orchestrated failures per framework, with the median launch time of each."""
    lines = [
        f"{'framework':<10} {'launcher':<10} {'naive failed':>14} {'orchestrated failed':>20} "
        f"{'naive median':>13} {'orchestrated median':>20}"
    ]
    for name in FRAMEWORKS:
        naive = [r for r in results if r.framework == name and r.mode == "naive"]
        orch = [r for r in results if r.framework == name and r.mode == "orchestrated"]
        if not naive:
            continue
        lines.append(
            f"{name:<10} {LAUNCHER[name]:<10} {_rate(naive):>14} {_rate(orch):>20} "
            f"{_median(naive):>13} {_median(orch):>20}"
        )
    return "\n".join(lines)


def _rate(rs: Sequence[TrialResult]) -> str:
    failed = sum(not r.ok for r in rs)
    return f"{failed}/{len(rs)} ({100 * failed / len(rs):.0f} %)" if rs else "-"


def _median(rs: Sequence[TrialResult]) -> str:
    return f"{sorted(r.seconds for r in rs)[len(rs) // 2]:.1f} s" if rs else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=10, help="jobs per framework and mode (default 10)")
    parser.add_argument("--mpi-workers", type=int, default=3, help="MPI worker pods per job (default 3)")
    parser.add_argument("--ray-workers", type=int, default=2, help="Ray worker pods per job (default 2)")
    parser.add_argument("--framework", choices=FRAMEWORKS, action="append", help="only these (repeatable)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the start delays (default 1)")
    parser.add_argument(
        "--delay",
        type=float,
        nargs=2,
        default=(0.0, 10.0),
        metavar=("LOW", "HIGH"),
        help="containers start after a delay uniform in [LOW, HIGH] s (default 0 10)",
    )
    parser.add_argument("--testbed", type=Path, help="a running testbed's directory (default: start one)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (containerd)")
    frameworks = tuple(args.framework or FRAMEWORKS)
    with contextlib.ExitStack() as stack:
        directory = args.testbed or stack.enter_context(table1.own_testbed())
        testbed = prepare(directory)
        started = time.perf_counter()
        load = os.getloadavg()[0]
        results = asyncio.run(
            run_table(
                testbed,
                trials=args.trials,
                workers={"mpi": args.mpi_workers, "ray": args.ray_workers},
                seed=args.seed,
                low=args.delay[0],
                high=args.delay[1],
                frameworks=frameworks,
            )
        )
        print(format_table(results))
        print(
            f"({args.trials} jobs per framework and mode; MPI 1 coordinator + {args.mpi_workers} workers, "
            f"Ray 1 head + {args.ray_workers} workers; container start delays U[{args.delay[0]:g}, "
            f"{args.delay[1]:g}] s, seed {args.seed}; {time.perf_counter() - started:.0f} s; "
            f"{os.cpu_count()}-core {os.uname().machine}, load average {load:.1f} at start, "
            f"{os.getloadavg()[0]:.1f} at end)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
