#!/usr/bin/env python3
"""End-to-end: a streaming trainer hot-restarted mid-stream, with and without
streaming-data staging (WeFlex §3.3, Fig. 4 and the input-rate figure of §4.5).

For each mode it starts a real ``nats-server -js`` (its own store), a live stream whose buffer
holds ``--buffer-seconds`` of input (discard old, as the input queue of Fig. 4), a producer
process publishing numbered records at ``--rate`` records/s (``Nats-Msg-Id`` = number) for
``--seconds``, and the trainer (``hack/stream_trainer.py``: consume, checkpoint, commit).
``--restarts`` times, evenly spread, the trainer is restarted; each new trainer spends
``--down`` seconds loading its model before it reads again.

``--runtime containerd`` (root): the trainer is a container on the containerd testbed
(``hack/containerd-testbed.sh``; started here unless ``--cri-endpoint`` names a running one),
restarted by the node agent's own hot-restart path — a ``flexlease.io/hot-restart`` request
on its pod, reconciled by :class:`nodeagent.hotrestart.controller.HotRestartController`
(``direct`` strategy: the replacement is created and started in the same sandbox, images
alternating between ``--images``), with staging through the agent's hook
(:class:`nodeagent.hotrestart.component.RuntimeStaging`: W from formulas 1–3 with the node's
caches, plus ``--margin``). The container runs the host's Python: the image is the testbed's
busybox trainer, and the interpreter, its libraries, site-packages and this repository are
read-only volumes; it uses the node's network (``hostNetwork``) to reach nats-server on
127.0.0.1. ``--runtime process``: the trainer is a process, stopped with SIGTERM and started
again, and the Stager is called as the hot-restart controller calls it (``begin`` before the
stop, ``restarted`` once the new process runs).

At the end it prints both runs side by side: records produced, taken once, lost, taken
twice, and the catch-up time after each restart (from the moment the new trainer reads until
its committed offset reached the live stream's head at that moment), and draws the records
consumed per second over time with the restarts shaded (``--plot``; matplotlib).

    python hack/stream_restarts.py [--runtime process|containerd] [--rate 20000] [--seconds 40] \\
        [--restarts 3] [--down 3] [--buffer-seconds 1] [--margin 5] [--plot docs/img/staging-restarts.png]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from matplotlib.figure import Figure
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

import flexlease.logging
from flexlease import tasks
from flexlease.api import keys
from flexlease.config import AgentSettings
from flexlease.prelaunch import PrelaunchInputs, prelaunch_window
from flexlease.store.base import JsonObj, Kind
from flexlease.store.memory import MemoryStore
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream, publish
from nodeagent.cache.component import NodeRuntime
from nodeagent.cri import podspec
from nodeagent.cri.client import ContainerState
from nodeagent.hotrestart.component import RuntimeStaging
from nodeagent.hotrestart.controller import HotRestartController, HotRestartMetrics
from nodeagent.hotrestart.model import Phase, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter
from nodeagent.staging import Stager, Staging, StagingMetrics

SELF = Path(__file__).resolve()
REPO = SELF.parents[1]
TESTBED = REPO / "hack" / "containerd-testbed.sh"
BINDING = StreamBinding("LIVE", "live.job", "job-1")
NODE = "node-1"
POD_NS, POD_NAME = "ml", "trainer-0"
MIB = 1 << 20


@dataclass
class Run:
    mode: str
    produced: int = 0
    taken: int = 0
    lost: int = 0
    dup: int = 0
    gaps: int = 0
    restarts: list[tuple[float, float]] = field(default_factory=list)
    catchup: list[float] = field(default_factory=list)
    stager_catchup: list[float] = field(default_factory=list)
    overflows: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)
    t0: float = 0.0


@dataclass(frozen=True)
class Testbed:
    """A running containerd testbed (``hack/containerd-testbed.sh`` output): the CRI
    endpoint, the pod log root, the cgroup parent and two trainer images."""

    endpoint: str
    log_root: Path
    cgroup_parent: str
    images: tuple[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nats(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    with (directory / "nats.log").open("wb") as log:  # the server keeps its own descriptor
        proc = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(directory / "js")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nats-server did not start: {(directory / 'nats.log').read_text()[-2000:]}")


def trainer_args(url: str, state: Path, *, load_seconds: float) -> list[str]:
    """hack/stream_trainer.py's command line (after the interpreter)."""
    return [
        str(REPO / "hack" / "stream_trainer.py"),
        *("--url", url, "--stream", BINDING.stream, "--subject", BINDING.subject),
        *("--durable", BINDING.durable, "--state", str(state), "--load-seconds", str(load_seconds)),
    ]


def started_at(state: Path) -> float:
    """When the current trainer started reading (its ``started`` file); 0 before."""
    try:
        return float(json.loads((state / "started").read_text()))
    except (OSError, ValueError):
        return 0.0


async def wait_started(state: Path, *, after: float, alive: Callable[[], bool], limit: float = 120) -> float:
    """Wait until a trainer started reading after ``after`` (unix time); returns that time.
    Raises ``SystemExit`` when ``alive()`` turns false or after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while (t := started_at(state)) <= after:
        if not alive() or time.monotonic() > deadline:
            raise SystemExit(f"the trainer did not start reading (state {state})")
        await asyncio.sleep(0.02)
    return t


class Trainer(Protocol):
    """The trainer under test, however it runs."""

    async def start(self) -> None: ...

    async def restart(self, image_index: int) -> tuple[float, float, Staging | None]:
        """Restart it; returns (unix time the restart began, unix time the new trainer reads,
        the staging begun for it or None)."""
        ...

    async def stop(self) -> None: ...


class ProcessTrainer:
    """The trainer as a process; restarts call the Stager as the hot-restart controller does."""

    def __init__(
        self, url: str, state: Path, stager: Stager | None, pod: JsonObj, *, window: float, down: float
    ) -> None:
        self.url, self.state, self.stager, self.pod = url, state, stager, pod
        self.window, self.down = window, down
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        args = trainer_args(self.url, self.state, load_seconds=self.down)
        return subprocess.Popen([sys.executable, *args], env=env, cwd=REPO)

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        self.proc = self._spawn()
        await wait_started(self.state, after=0.0, alive=self._alive)

    async def restart(self, image_index: int) -> tuple[float, float, Staging | None]:
        assert self.proc is not None
        began = time.time()
        staging = await self.stager.begin(self.pod, window_seconds=self.window) if self.stager else None
        self.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.proc.wait)
        self.proc = self._spawn()
        if staging is not None:
            staging.restarted()
        ended = await wait_started(self.state, after=began, alive=self._alive)
        return began, ended, staging

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)
            except TimeoutError:
                self.proc.kill()
        self.proc = None


def host_python_mounts() -> tuple[podspec.HostMount, ...]:
    """Read-only volumes that let a container without Python run this interpreter at the same
    paths: ``/usr``, ``/lib``, ``/lib64`` (the C library and shared libraries; a merged-/usr
    symlink is mounted as its target), the interpreter's prefixes, any ``sys.path`` directory
    outside them, and this repository."""
    mounts: dict[str, Path] = {}
    for path in ("/usr", "/lib", "/lib64"):
        if os.path.isdir(path):
            mounts[path] = Path(os.path.realpath(path))
    covered = [*mounts]
    for path in (sys.base_prefix, sys.prefix, *sys.path, str(REPO)):
        real = os.path.realpath(path) if path else ""
        if real and os.path.isdir(real) and not any(real == c or real.startswith(c + "/") for c in covered):
            mounts[real] = Path(real)
            covered.append(real)
    return tuple(podspec.HostMount(host, target, readonly=True) for target, host in sorted(mounts.items()))


class ContainerTrainer:
    """The trainer as a container in a sandbox on the containerd testbed, restarted through
    the node agent's hot-restart controller (``direct`` strategy) and, with ``stager``, its
    staging hook."""

    def __init__(
        self,
        testbed: Testbed,
        store: MemoryStore,
        stager: Stager | None,
        *,
        url: str,
        state: Path,
        work: Path,
        down: float,
        registry: CollectorRegistry,
    ) -> None:
        self.testbed, self.store, self.stager = testbed, store, stager
        self.url, self.state, self.down = url, state, down
        settings = AgentSettings(node_name=NODE, cri_endpoint=testbed.endpoint, checkpoint_dir=work / "ckpt")
        self.runtime = NodeRuntime(settings, registry)
        self.sandbox_id: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.registry = registry

    async def start(self) -> None:
        self.runtime.cri.open()
        await self.runtime.cri.probe()
        await self.runtime.checkpoints.open()
        pod = await self.store.get(Kind.POD, POD_NAME, namespace=POD_NS)
        ref = podspec.PodRef(POD_NS, POD_NAME, pod["metadata"]["uid"])
        sandbox = podspec.sandbox_config(
            ref, self.testbed.log_root, cgroup_parent=self.testbed.cgroup_parent, host_network=True
        )
        self.sandbox_id = await self.runtime.cri.run_pod_sandbox(sandbox)
        spec = podspec.ContainerSpec(
            name="trainer",
            image=self.testbed.images[0],
            command=(sys.executable, *trainer_args(self.url, Path("/state"), load_seconds=self.down)),
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "PYTHONPATH": str(REPO),
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
            },
            mounts=(*host_python_mounts(), podspec.HostMount(self.state, "/state")),
        )
        config = podspec.container_config(ref, spec, host_network=True)
        cid = await self.runtime.cri.create_container(self.sandbox_id, config, sandbox)
        await self.runtime.cri.start_container(cid)
        restarter = HotRestarter(
            self.runtime.cri,
            self.runtime.images,
            checkpoints=self.runtime.checkpoints,
            stop_timeout_seconds=30,
        )
        controller = HotRestartController(
            self.store,
            self.runtime.cri,
            restarter,
            node=NODE,
            default_strategy=Strategy.DIRECT,
            metrics=HotRestartMetrics(self.registry),
            staging=RuntimeStaging(self.stager, self.runtime) if self.stager is not None else None,
        )
        self._task = asyncio.create_task(controller.run(), name="hotrestart-controller")
        await asyncio.wait_for(controller.listed.wait(), 30)
        await wait_started(self.state, after=0.0, alive=self._alive)

    def _alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def restart(self, image_index: int) -> tuple[float, float, Staging | None]:
        began = time.time()
        request_id = uuid.uuid4().hex[:8]
        image = self.testbed.images[image_index % len(self.testbed.images)]
        request = json.dumps({"id": request_id, "container": "trainer", "image": image})
        patch = {"metadata": {"annotations": {keys.ANN_HOT_RESTART: request}}}
        await self.store.patch(Kind.POD, POD_NAME, patch, namespace=POD_NS)
        while True:
            pod = await self.store.get(Kind.POD, POD_NAME, namespace=POD_NS)
            status = parse_status(pod["metadata"]["annotations"].get(keys.ANN_HOT_RESTART_STATUS))
            if status is not None and status.id == request_id and status.phase.final:
                break
            if not self._alive():
                raise SystemExit("the hot-restart controller stopped")
            await asyncio.sleep(0.05)
        if status.phase is not Phase.SUCCEEDED:
            raise SystemExit(f"hot restart failed: {status.message}")
        ended = await wait_started(self.state, after=began, alive=self._alive)
        staging = self.stager.stagings.get(f"{POD_NS}/{POD_NAME}") if self.stager is not None else None
        return began, ended, staging

    async def stop(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):  # a controller that died failed the restart already
                await tasks.stop(self._task)
        if self.sandbox_id is not None:
            for c in await self.runtime.cri.list_containers(sandbox_id=self.sandbox_id):
                if c.state is ContainerState.RUNNING:
                    await self.runtime.cri.stop_container(c.id, timeout_seconds=30)
            await self.runtime.cri.stop_pod_sandbox(self.sandbox_id)
            await self.runtime.cri.remove_pod_sandbox(self.sandbox_id)
            self.sandbox_id = None
        await self.runtime.cri.close()


async def produce(url: str, rate: int, seconds: float, *, per_message: int = 1) -> int:
    """Publish records 1..rate*seconds at ``rate``/s in 10 ms ticks, ``per_message`` records
    per message (each record a line ``<number>|<64 bytes>``; the message's ``Nats-Msg-Id`` is
    its first record's number); returns the records published."""
    pad = b"x" * 64
    n = 0
    async with JetStreamBroker(url) as broker:
        start = time.monotonic()
        total = int(rate * seconds)
        while n < total:
            due = min(total, int((time.monotonic() - start) * rate))
            while n < due and (due - n >= per_message or due == total):
                count = min(per_message, total - n)
                body = b"".join(b"%d|%s\n" % (k, pad) for k in range(n + 1, n + count + 1))
                await publish(broker, BINDING.subject, n + 1, body)
                n += count
            await broker.nc.flush()
            await asyncio.sleep(0.01)
    return n


def produce_main(args: argparse.Namespace) -> int:
    n = asyncio.run(produce(args.url, args.rate, args.seconds, per_message=args.records_per_message))
    print(n)
    return 0


async def committed_reaches(broker: JetStreamBroker, target: int, *, limit: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        commit = await broker.committed(BINDING.durable)
        if commit is not None and commit.seq >= target:
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    return None


async def first_record(broker: JetStreamBroker, *, limit: float = 60) -> None:
    """Wait until the producer's first record is in the live stream."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (await broker.stream_state(BINDING.stream)).last_seq > 0:
            return
        await asyncio.sleep(0.01)
    raise SystemExit("the producer published nothing")


def restart_window() -> float:
    """W for the process mode's restarts (formulas 1–3): image prelaunched and checkpoint
    cached (η = 1), so W = S_ckpt / B_gpu for a 256 MiB checkpoint."""
    return prelaunch_window(
        PrelaunchInputs(
            image_bytes=256 * MIB,
            checkpoint_bytes=256 * MIB,
            net_bps=1.25e9,
            registry_bps=1.25e9,
            storage_bps=1.25e9,
            gpu_bps=25e9,
            image_hit_ratio=1.0,
            checkpoint_hit_ratio=1.0,
        )
    ).window_seconds


async def one_run(mode: str, args: argparse.Namespace, work: Path, testbed: Testbed | None) -> Run:
    run = Run(mode)
    directory = work / mode
    directory.mkdir()
    state = directory / "trainer"
    state.mkdir()
    nats, url = start_nats(directory)
    store = MemoryStore()
    registry = CollectorRegistry()
    trainer: Trainer | None = None
    try:
        async with JetStreamBroker(url) as broker:
            buffer = math.ceil(args.rate * args.buffer_seconds / args.records_per_message)  # messages
            await ensure_live_stream(broker, BINDING.stream, subjects=[BINDING.subject], max_msgs=buffer)
            annotations = {
                keys.ANN_STREAM: BINDING.stream,
                keys.ANN_STREAM_SUBJECT: BINDING.subject,
                keys.ANN_STREAM_DURABLE: BINDING.durable,
                keys.ANN_STAGING_MARGIN: str(args.margin),
            }
            image = testbed.images[0] if testbed is not None else "trainer"
            pod = await store.create(
                Kind.POD,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": POD_NAME, "namespace": POD_NS, "annotations": annotations},
                    "spec": {"nodeName": NODE, "containers": [{"name": "trainer", "image": image}]},
                },
            )
            stager = (
                Stager(broker, store, StagingMetrics(registry, node=NODE), node=NODE)
                if mode == "staging"
                else None
            )
            if testbed is None:
                trainer = ProcessTrainer(url, state, stager, pod, window=restart_window(), down=args.down)
            else:
                trainer = ContainerTrainer(
                    testbed,
                    store,
                    stager,
                    url=url,
                    state=state,
                    work=directory,
                    down=args.down,
                    registry=registry,
                )
            async with asyncio.TaskGroup() as tg:
                stager_task = tg.create_task(stager.run(), name="stager") if stager is not None else None
                await trainer.start()
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                }
                producer = await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(SELF),
                    "produce",
                    *("--url", url, "--rate", str(args.rate), "--seconds", str(args.seconds)),
                    *("--records-per-message", str(args.records_per_message)),
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                    cwd=REPO,
                )
                await first_record(broker)
                run.t0 = time.time()
                for i in range(args.restarts):
                    at = args.seconds * (i + 1) / (args.restarts + 1)
                    await asyncio.sleep(max(0.0, run.t0 + at - time.time()))
                    began, ended, staging = await trainer.restart(i + 1)
                    run.restarts.append((began - run.t0, ended - run.t0))
                    print(f"{mode}: restart {i + 1} down {ended - began:.2f}s", file=sys.stderr, flush=True)
                    head = (await broker.stream_state(BINDING.stream)).last_seq
                    took = await committed_reaches(broker, head, limit=60)
                    run.catchup.append(took if took is not None else float("nan"))
                    if staging is not None:
                        await asyncio.wait_for(staging.done.wait(), 60)
                        run.stager_catchup.append(staging.catchup_seconds or float("nan"))
                print(f"{mode}: catch-up {run.catchup}", file=sys.stderr, flush=True)
                out, _ = await producer.communicate()
                run.produced = int(out.decode().split()[-1])
                await committed_reaches(
                    broker, (await broker.stream_state(BINDING.stream)).last_seq, limit=60
                )
                last = -1
                while True:  # until the trainer took everything it will get
                    ck = json.loads((state / "checkpoint.json").read_text())
                    if ck["expect"] > run.produced or ck["expect"] == last:
                        break
                    last = ck["expect"]
                    await asyncio.sleep(3.0)
                await trainer.stop()
                trainer = None
                if stager_task is not None:
                    stager_task.cancel()
    finally:
        if trainer is not None:
            await trainer.stop()
        await store.close()
        nats.terminate()
        nats.wait()
    ck = json.loads((state / "checkpoint.json").read_text())
    run.taken, run.dup, run.gaps = ck["taken"], ck["dup"], ck["gaps"]
    run.lost = run.produced - run.taken
    run.overflows = registry.get_sample_value("flexlease_staging_overflows_total", {"node": NODE}) or 0.0
    for line in (state / "timeline.txt").read_text().splitlines():
        t, n = line.split()
        run.timeline.append((float(t) - run.t0, int(n)))
    return run


@contextlib.asynccontextmanager
async def own_testbed() -> AsyncIterator[Testbed]:
    """Start a containerd testbed for this run and stop it after."""
    directory = Path(tempfile.mkdtemp(prefix="flexlease-testbed-stream-", dir="/tmp"))
    proc = await asyncio.to_thread(
        subprocess.run, [str(TESTBED), "start", str(directory)], capture_output=True, text=True, check=False
    )
    try:
        if proc.returncode != 0:
            raise SystemExit(f"the containerd testbed did not start:\n{proc.stderr[-3000:]}")
        env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        yield Testbed(
            endpoint=env["FLEXLEASE_CRI_ENDPOINT"],
            log_root=directory / "pod-logs",
            cgroup_parent=env["FLEXLEASE_TESTBED_CGROUP_PARENT"],
            images=(env["FLEXLEASE_TESTBED_TRAINER_V1"], env["FLEXLEASE_TESTBED_TRAINER_V2"]),
        )
    finally:
        await asyncio.to_thread(
            subprocess.run, [str(TESTBED), "stop", str(directory)], capture_output=True, check=False
        )


def table(runs: list[Run]) -> str:
    rows: list[tuple[str, Callable[[Run], str]]] = [
        ("records produced", lambda r: f"{r.produced:,}"),
        ("taken exactly once", lambda r: f"{r.taken:,}"),
        ("lost", lambda r: f"{r.lost:,}"),
        ("taken twice", lambda r: f"{r.dup:,}"),
        ("gaps reported to the job", lambda r: f"{r.gaps}"),
        ("staging overflows reported", lambda r: f"{r.overflows:.0f}"),
        ("restart down time (s)", lambda r: ", ".join(f"{b - a:.2f}" for a, b in r.restarts)),
        ("catch-up after restart (s)", lambda r: ", ".join(f"{c:.2f}" for c in r.catchup)),
    ]
    head = "| | " + " | ".join(r.mode for r in runs) + " |"
    sep = "|---|" + "---:|" * len(runs)
    body = [f"| {name} | " + " | ".join(f(r) for r in runs) + " |" for name, f in rows]
    return "\n".join([head, sep, *body])


def plot(runs: list[Run], path: Path, rate: int) -> None:
    fig = Figure(figsize=(9, 2.6 * len(runs)))
    axes = fig.subplots(len(runs), 1, sharex=True)
    for ax, run in zip(axes, runs, strict=True):
        bins: dict[int, int] = {}
        for t, n in run.timeline:
            bins[int(t / 0.5)] = bins.get(int(t / 0.5), 0) + n
        xs = list(range(0, max(bins) + 1)) if bins else []  # no record in a bin: 0/s (the trainer was down)
        color = "tab:orange" if run.mode == "staging" else "tab:blue"
        ax.plot(
            [x * 0.5 for x in xs],
            [bins.get(x, 0) / 0.5 for x in xs],
            color=color,
            lw=1.2,
            label="consumed / s",
        )
        ax.axhline(rate, color="grey", ls="--", lw=0.8, label=f"input rate ({rate:,}/s)")
        for a, b in run.restarts:
            ax.axvspan(a, b, color="red", alpha=0.15)
        ax.set_ylabel("records / s")
        ax.set_title(f"{run.mode}: {run.lost:,} lost, {run.dup:,} twice of {run.produced:,}", fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds (shaded: trainer restarting)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


async def runs(args: argparse.Namespace, testbed: Testbed | None) -> list[Run]:
    work = Path(tempfile.mkdtemp(prefix="flexlease-stream-"))
    out = []
    try:
        for mode in ("staging", "no staging"):
            out.append(await one_run(mode.replace(" ", "-"), args, work, testbed))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


async def main_async(args: argparse.Namespace) -> int:
    load = os.getloadavg()
    if args.runtime == "process":
        done = await runs(args, None)
    elif args.cri_endpoint:
        images = tuple(args.images.split(","))
        if len(images) != 2 or args.log_root is None:
            raise SystemExit("--cri-endpoint needs --images A,B and --log-root (and --cgroup-parent)")
        testbed = Testbed(args.cri_endpoint, args.log_root, args.cgroup_parent, (images[0], images[1]))
        done = await runs(args, testbed)
    else:
        async with own_testbed() as testbed:
            done = await runs(args, testbed)
    trainer = "a container (containerd, hot restart: direct)" if args.runtime == "containerd" else "a process"
    print(
        f"{args.rate:,} records/s for {args.seconds:g} s, {args.restarts} restarts"
        f" (model load {args.down:g} s), trainer as {trainer},"
        f" {args.records_per_message} record(s) per message,"
        f" live buffer {args.buffer_seconds:g} s of input, margin {args.margin:g} s; "
        f"{platform.machine()}, {os.cpu_count()} cores, load average before {load[0]:.2f}"
        f" after {os.getloadavg()[0]:.2f}"
    )
    print(table(done))
    if args.plot:
        plot(done, args.plot, args.rate)
        print(f"plot: {args.plot}")
    return 0 if done[0].lost == 0 and done[0].dup == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "produce":
        p = argparse.ArgumentParser(prog="stream_restarts.py produce")
        p.add_argument("--url", required=True)
        p.add_argument("--rate", type=int, required=True)
        p.add_argument("--seconds", type=float, required=True)
        p.add_argument("--records-per-message", type=int, default=1)
        return produce_main(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(prog="hack/stream_restarts.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=20_000, help="records/s")
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--down", type=float, default=3.0, help="seconds a new trainer loads its model")
    p.add_argument("--runtime", choices=("process", "containerd"), default="process")
    p.add_argument("--cri-endpoint", default=None, help="a running testbed's CRI socket (containerd)")
    p.add_argument("--images", default="", help="two trainer images of that testbed, A,B")
    p.add_argument("--log-root", type=Path, default=None, help="that testbed's pod log directory")
    p.add_argument("--cgroup-parent", default="", help="that testbed's cgroup parent")
    p.add_argument("--buffer-seconds", type=float, default=1.0, help="live buffer, seconds of input")
    p.add_argument("--margin", type=float, default=5.0, help="staging margin, seconds")
    p.add_argument(
        "--records-per-message", type=int, default=1, help="records batched in one message (offset unit)"
    )
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--log-level", default="WARNING", help="the agent parts' log level (stderr)")
    args = p.parse_args(argv)
    flexlease.logging.setup(args.log_level, "text")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
