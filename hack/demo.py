"""The local demo: one accelerated day of right-of-return leasing on real processes.

Run by ``hack/local-up.sh`` (the README's first command), which starts a private containerd
(``hack/containerd-testbed.sh``) and passes its ``FLEXLEASE_*`` variables here. What runs:

* the real extender (``python -m extender.main``: filter/prioritize/bind/preempt and the lease
  controller) on a SQLite store, its clock ``--speedup`` times faster than real time; it serves
  plain HTTP on 127.0.0.1, explicitly (``extender.insecure_http``, set by
  :func:`flexlease.sim.extender_proc.extender_env`): a cluster uses mutual TLS (README, Security);
* one real node agent per node (``python -m nodeagent.main``) with simulated GPUs (8 × H20
  each; one node's GPU 3 falls off the bus, XID 79, at 06:00), writing ``GPUNode.status``,
  and doing in-sandbox hot restarts on the real containerd (``strategy: direct``);
* this driver, which plays kube-scheduler (every pending pod goes filter → prioritize → bind
  through the extender, wire format of ``k8s.io/kube-scheduler/extender/v1``), a kubelet
  stand-in (every bound pod is admitted through its node agent's device plugin over gRPC —
  ``GetPreferredAllocation`` → ``Allocate``; no ``PreStartContainer``, which the plugin does
  not ask for — with one test kubelet per node from ``standins.kubelet_devices`` serving
  Registration and PodResources — then runs as a CRI sandbox + container with the
  ``NVIDIA_VISIBLE_DEVICES`` the plugin returned; evicted pods are torn down) and the online
  job's controller.

The day (simulated time): 00:00 the online job ``recsys/ranker`` starts 16 one-GPU HA pods on
nodes gpu-0 and gpu-1, and its ``GPULeasePolicy`` is created: a schedule of 8 GPUs from 01:00 to
09:00, 16 otherwise, lead time ``auto`` — the leases of the day are the extender's lease
autopilot's (``extender.autopilot``), none is written by hand; 01:00 traffic falls, the
autopilot writes a count Lend of 8 and the job's controller scales down gpu-1's 8 pods;
02:00 low-priority jobs take them and gpu-2; 06:00 gpu-1/3 fails; a lead time before the 09:00
peak (the prelaunch window W the agents publish, the grace period, the autopilot's resync) the
autopilot writes the Reclaim, which gives the LP pods a graceful-reclaim notice and evicts them,
the failed GPU is
supplemented from the standby node gpu-3, the job's 8 pods come back onto the same GPUs, the
extender's rollout controller restarts the 8 pods that stayed in place so the job picks up its
new GPU set (as it did after the lend; ``extender.rollout``), and then they are hot-restarted
in their sandboxes onto the new model image.
Prints a report (including whether every pod ran on exactly its assigned GPUs) and writes
``report.json`` and ``gpu-timeline.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import yaml
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from flexlease.api import keys
from flexlease.api.pod import parse_pod, pod_gpu_count
from flexlease.api.policy import GPULeasePolicy
from flexlease.api.resources import DeviceKey, LeaseAction, Pool, parse_gpulease, parse_gpunode
from flexlease.api.tiers import Tier
from flexlease.clock import format_time
from flexlease.errors import FlexleaseError, NotFound, StoreError
from flexlease.sim import objects
from flexlease.sim.extender_client import ExtenderCallError, ExtenderClient
from flexlease.sim.extender_proc import free_port, running_extender
from flexlease.store import graceful
from flexlease.store.base import JsonObj, Kind
from flexlease.store.sqlite import SqliteStore
from hack.waiting import poll
from nodeagent.cri import podspec
from nodeagent.cri.client import GrpcCri
from nodeagent.deviceplugin.response import ENV_VISIBLE_DEVICES
from nodeagent.hotrestart.model import HotRestartStatus
from standins.kubelet_devices import AdmissionError, DeviceKubelet

OWNER_JOB: Final = "ranker"
OWNER_NS: Final = "recsys"
OWNER: Final = f"{OWNER_NS}/{OWNER_JOB}"
LP_NS: Final = "batch"
MODEL: Final = "NVIDIA H20"
GPUS_PER_NODE: Final = 8
GENERAL: Final = ("gpu-0", "gpu-1", "gpu-2")
STANDBY: Final = ("gpu-3",)
LENT_NODE: Final = "gpu-1"
FAILED_GPU: Final = DeviceKey(LENT_NODE, 3)
HOUR: Final = 3600.0


class DemoError(FlexleaseError):
    """A step of the demo did not complete (with what was seen)."""


@dataclass(frozen=True, slots=True)
class Testbed:
    """The containerd testbed's address and images (``hack/containerd-testbed.sh`` output)."""

    endpoint: str
    trainer_v1: str
    trainer_v2: str
    log_root: Path
    cgroup_parent: str

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Testbed:
        """Raises ``DemoError`` naming the missing variable."""
        try:
            return cls(
                endpoint=env["FLEXLEASE_CRI_ENDPOINT"],
                trainer_v1=env["FLEXLEASE_TESTBED_TRAINER_V1"],
                trainer_v2=env["FLEXLEASE_TESTBED_TRAINER_V2"],
                log_root=Path(env["FLEXLEASE_TESTBED_DIR"]) / "pod-logs",
                cgroup_parent=env["FLEXLEASE_TESTBED_CGROUP_PARENT"],
            )
        except KeyError as exc:
            raise DemoError(f"{exc.args[0]} is not set: run the demo through hack/local-up.sh") from exc


class SimClock:
    """Simulated seconds since 00:00 of the demo day: real seconds × ``speedup``. ``origin``:
    the real epoch second the extender's clock is pinned to (``clock_origin``); the extender's
    time at the demo's 00:00 is then :attr:`extender_epoch`."""

    def __init__(self, speedup: float, *, origin: float | None = None) -> None:
        self.speedup = speedup
        self._t0 = time.monotonic()
        wall = time.time()
        self.extender_epoch = wall if origin is None else origin + (wall - origin) * speedup

    def extender_time(self, sim_seconds: float) -> datetime:
        """The extender's clock (UTC) at the demo's simulated second ``sim_seconds``."""
        return datetime.fromtimestamp(self.extender_epoch + sim_seconds, UTC)

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.speedup

    def hhmm(self, t: float | None = None) -> str:
        t = self.now() if t is None else t
        return f"{int(t // HOUR):02d}:{int(t % HOUR // 60):02d}"

    async def until(self, sim_seconds: float) -> None:
        """Sleep until simulated time ``sim_seconds`` (at once when already past)."""
        await asyncio.sleep(max(0.0, (sim_seconds - self.now()) / self.speedup))


@dataclass(slots=True)
class RunningPod:
    sandbox_id: str
    pod_ip: str
    start_seconds: float
    node: str = ""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class DeviceCheck:
    """One pod's GPUs: what the extender assigned (``assigned-uuids`` when the kubelet
    stand-in admitted it) and what the device plugin made kubelet allocate and the container
    see (``NVIDIA_VISIBLE_DEVICES``)."""

    pod: str
    node: str
    assigned: tuple[str, ...]
    allocated: tuple[str, ...]
    visible: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return set(self.assigned) == set(self.allocated) and self.visible == self.assigned


@dataclass(slots=True)
class Kubelet:
    """Stand-in kubelet for every node (one containerd here): admits each bound, non-terminated
    pod through its node's test kubelet (``devices[node]``, which calls that node agent's device
    plugin over gRPC), runs it as a sandbox with one container (the pod's image, with the
    plugin's ``NVIDIA_VISIBLE_DEVICES``) and reports it Running with its pod IP. For a pod being
    deleted (Terminating: ``deletionTimestamp`` set by a delete or an eviction) it stops the
    sandbox, frees its devices, then confirms the deletion with grace period 0, as the kubelet's
    status manager does, so the pod holds its GPUs until its containers are gone; tears down
    the sandboxes of pods that are gone."""

    cri: GrpcCri
    testbed: Testbed
    store: SqliteStore
    devices: dict[str, DeviceKubelet] = field(default_factory=dict)
    running: dict[str, RunningPod] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    checks: list[DeviceCheck] = field(default_factory=list)

    async def sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in (await self.store.list(Kind.POD)).items}
        for uid, pod in list(pods.items()):
            if pod["metadata"].get("deletionTimestamp"):
                if uid in self.running:
                    await self._stop(uid)
                meta = pod["metadata"]
                await graceful.confirm_pod_deletion(self.store, meta["namespace"], meta["name"])
                del pods[uid]
        for uid in [u for u in self.running if u not in pods]:
            await self._stop(uid)  # first, so a pod's devices are free before a successor's admission
        for uid, pod in pods.items():
            if uid in self.running or not pod["spec"].get("nodeName"):
                continue
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            await self._start(pod)

    async def _admit(self, pod: JsonObj) -> dict[str, str]:
        """Device-plugin admission on the pod's node; the container's extra environment."""
        meta = pod["metadata"]
        count = pod_gpu_count(pod)
        node = pod["spec"]["nodeName"]
        if count == 0:
            return {}
        container = pod["spec"]["containers"][0]["name"]
        kubelet = self.devices[node]
        got = await kubelet.admit(
            meta["namespace"], meta["name"], [(container, count)], resource=keys.DEFAULT_GPU_RESOURCE
        )
        env = dict(got[container].response.envs)
        assigned = meta.get("annotations", {}).get(keys.ANN_ASSIGNED_UUIDS, "")
        self.checks.append(
            DeviceCheck(
                pod=f"{meta['namespace']}/{meta['name']}",
                node=node,
                assigned=tuple(u for u in assigned.split(",") if u),
                allocated=got[container].devices,
                visible=tuple(u for u in env.get(ENV_VISIBLE_DEVICES, "").split(",") if u),
            )
        )
        return env

    async def _start(self, pod: JsonObj) -> None:
        meta = pod["metadata"]
        ref = podspec.PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        started = time.perf_counter()
        config = podspec.sandbox_config(ref, self.testbed.log_root, cgroup_parent=self.testbed.cgroup_parent)
        node = pod["spec"]["nodeName"]
        try:
            env = await self._admit(pod)
        except AdmissionError as exc:
            self.errors.append(f"{meta['namespace']}/{meta['name']}: {exc}")
            return
        try:
            sandbox_id = await self.cri.run_pod_sandbox(config)
            container = pod["spec"]["containers"][0]
            spec = podspec.ContainerSpec(name=container["name"], image=container["image"], env=env)
            cid = await self.cri.create_container(sandbox_id, podspec.container_config(ref, spec), config)
            await self.cri.start_container(cid)
            ip = (await self.cri.pod_sandbox_status(sandbox_id)).ip or ""
        except FlexleaseError as exc:
            self.errors.append(f"{meta['namespace']}/{meta['name']}: {exc}")
            return
        self.running[meta["uid"]] = RunningPod(
            sandbox_id, ip, time.perf_counter() - started, node, meta["namespace"], meta["name"]
        )
        with contextlib.suppress(NotFound):
            await self.store.patch(
                Kind.POD,
                meta["name"],
                {"status": {"phase": "Running", "podIP": ip, "startTime": format_time(datetime.now(UTC))}},
                namespace=meta["namespace"],
                subresource="status",
            )

    async def _stop(self, uid: str) -> None:
        sandbox = self.running.pop(uid)
        if sandbox.node in self.devices:
            self.devices[sandbox.node].remove(sandbox.namespace, sandbox.name)
        with contextlib.suppress(FlexleaseError):
            await self.cri.stop_pod_sandbox(sandbox.sandbox_id)
            await self.cri.remove_pod_sandbox(sandbox.sandbox_id)

    async def teardown(self) -> None:
        for uid in list(self.running):
            await self._stop(uid)

    async def loop(self) -> None:
        while True:
            try:
                await self.sync()
            except StoreError as exc:
                self.errors.append(f"sync: {exc}")
            await asyncio.sleep(0.1)


def node_config(name: str) -> JsonObj:
    """The simulated GPUs of ``name`` (agent ``--node-config``); gpu-1/3 fails at 06:00."""
    events: list[JsonObj] = []
    if name == FAILED_GPU.node:
        events.append({"at": 6 * HOUR, "gpu": FAILED_GPU.index, "event": "xid", "xid": 79})
        events.append({"at": 6 * HOUR, "gpu": FAILED_GPU.index, "event": "lost"})  # off the bus
    return {
        "name": name,
        "gpus": {"count": GPUS_PER_NODE, "model": MODEL, "memoryMiB": 97871},
        "events": events,
    }


@contextlib.asynccontextmanager
async def device_kubelets(nodes: Sequence[str]) -> AsyncIterator[dict[str, DeviceKubelet]]:
    """One test kubelet per node, each with its own device-plugin directory and PodResources
    socket under a short temporary directory (unix socket paths are limited to 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="flexlease-demo-", dir="/tmp"))
    kubelets = {
        n: DeviceKubelet(base / n / "device-plugins", base / n / "pod-resources" / "kubelet.sock")
        for n in nodes
    }
    try:
        for k in kubelets.values():
            await k.start()
        yield kubelets
    finally:
        for k in kubelets.values():
            await k.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_agents(
    nodes: Sequence[str],
    *,
    out: Path,
    db: Path,
    testbed: Testbed,
    speedup: float,
    kubelets: dict[str, DeviceKubelet],
) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """One ``python -m nodeagent.main`` per node (simulated NVML, SQLite store, direct hot
    restarts on the testbed's containerd, its device plugin registered with that node's test
    kubelet in ``kubelets``); SIGTERM on exit."""
    procs: list[asyncio.subprocess.Process] = []
    try:
        for name in nodes:
            cfg = out / "agents" / f"{name}.yaml"
            cfg.parent.mkdir(parents=True, exist_ok=True)
            cfg.write_text(yaml.safe_dump(node_config(name)))
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXLEASE_")}
            env.update(
                FLEXLEASE_LOG_FORMAT="json",
                FLEXLEASE_LOG_LEVEL="INFO",
                FLEXLEASE_STORE__SQLITE_POLL_SECONDS="0.01",
                FLEXLEASE_AGENT__NODE_IP="127.0.0.1",
                FLEXLEASE_AGENT__CRI_ENDPOINT=testbed.endpoint,
                FLEXLEASE_AGENT__HOT_RESTART_STRATEGY="direct",
                FLEXLEASE_AGENT__CHECKPOINT_DIR=str(out / "agents" / name / "checkpoints"),
                FLEXLEASE_AGENT__RECOVERY_HOLD_DOWN_SECONDS="1800",
                FLEXLEASE_AGENT__DEVICE_PLUGIN_DIR=str(kubelets[name].plugin_dir),
                FLEXLEASE_AGENT__POD_RESOURCES_SOCKET=str(kubelets[name].pod_resources_socket),
                FLEXLEASE_AGENT__DEVICE_PLUGIN_POLL_SECONDS="0.2",
                FLEXLEASE_AGENT__POD_RESOURCES_SECONDS="1",
                FLEXLEASE_CLOCK_SPEEDUP=f"{speedup:g}",
                PYTHONUNBUFFERED="1",
            )
            log = (out / "agents" / f"{name}.log").open("wb")
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "nodeagent.main",
                    "--nvml=simulated",
                    f"--node-config={cfg}",
                    f"--node-name={name}",
                    "--store=sqlite",
                    f"--sqlite-path={db}",
                    f"--state-dir={out / 'agents' / name}",
                    "--metrics-host=127.0.0.1",
                    f"--metrics-port={free_port()}",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                )
            )
            log.close()
        yield procs
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 15)
            except TimeoutError:
                p.kill()
                await p.wait()


@dataclass(slots=True)
class Demo:
    """The driver: scheduler, online-job controller and recorder."""

    store: SqliteStore
    client: ExtenderClient
    kubelet: Kubelet
    clock: SimClock
    testbed: Testbed
    events: list[tuple[str, str]] = field(default_factory=list)
    timeline: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    ha_share: list[tuple[float, float]] = field(default_factory=list)
    unschedulable: dict[str, str] = field(default_factory=dict)

    def say(self, message: str) -> None:
        stamp = self.clock.hhmm()
        self.events.append((stamp, message))
        print(f"  [{stamp}] {message}", flush=True)

    async def wait_for(self, what: str, predicate: Any, *, limit_s: float = 60.0) -> Any:
        """Poll ``await predicate()`` until truthy; ``DemoError`` after ``limit_s`` real seconds."""
        return await poll(what, predicate, limit_s=limit_s, interval_s=0.05, error=DemoError)

    # -- scheduler -------------------------------------------------------------------------

    async def schedule(self, pod: JsonObj, candidates: Sequence[str]) -> str | None:
        """Create ``pod`` and run scheduling cycles until bound (returns the node) or one cycle
        finds no feasible node (None; the reason is kept in ``unschedulable``)."""
        created = await self.store.create(Kind.POD, pod)
        meta = created["metadata"]
        for _ in range(20):
            current = await self.store.get(Kind.POD, meta["name"], namespace=meta["namespace"])
            result = await self.client.filter(current, list(candidates))
            feasible = result.node_names or []
            if not feasible:
                self.unschedulable[meta["name"]] = "; ".join(
                    sorted(
                        set(result.failed_nodes.values()) | set(result.failed_and_unresolvable_nodes.values())
                    )
                )
                return None
            scores = await self.client.prioritize(current, feasible)
            best = max(scores, key=lambda host: (scores[host], host == feasible[0]))
            error = await self.client.bind(meta["namespace"], meta["name"], uid=meta["uid"], node=best)
            if not error:
                return best
            await asyncio.sleep(0.05)  # lost a race: another cycle, as kube-scheduler retries
        raise DemoError(f"pod {meta['name']} could not be bound")

    # -- observation -----------------------------------------------------------------------

    async def gpunodes(self) -> dict[str, Any]:
        return {o["metadata"]["name"]: parse_gpunode(o) for o in (await self.store.list(Kind.GPUNODE)).items}

    async def holders(self) -> dict[DeviceKey, JsonObj]:
        out: dict[DeviceKey, JsonObj] = {}
        for pod in (await self.store.list(Kind.POD)).items:
            req = parse_pod(pod)
            if req.assignment is not None and not req.terminated:
                for d in req.assignment.devices:
                    out[d] = pod
        return out

    async def sample(self) -> None:
        """Record every GPU's state (for the timeline plot) and the online job's HA share."""
        nodes = await self.gpunodes()
        holders = await self.holders()
        states: dict[str, str] = {}
        owned = ha = 0
        for name in (*GENERAL, *STANDBY):
            node = nodes.get(name)
            for i in range(GPUS_PER_NODE):
                key = DeviceKey(name, i)
                status = node.status.devices.get(str(i)) if node else None
                spec = node.spec.devices.get(str(i)) if node else None
                pod = holders.get(key)
                if status is not None and status.health.value != "Healthy":
                    state = "unhealthy"
                elif pod is not None:
                    state = "online job" if pod["metadata"]["namespace"] == OWNER_NS else "low priority"
                elif spec is not None and spec.owner:
                    state = "lent (tagged, free)"
                elif node is not None and node.spec.pool is Pool.STANDBY:
                    state = "standby"
                else:
                    state = "free"
                states[str(key)] = state
                if pod is not None and pod["metadata"]["namespace"] == OWNER_NS and node is not None:
                    owned += 1
                    ha += node.effective_tier(i) is Tier.HA
        self.timeline.append((self.clock.now(), states))
        if owned:
            self.ha_share.append((self.clock.now(), ha / owned))

    async def sampler(self) -> None:
        while True:
            with contextlib.suppress(StoreError):
                await self.sample()
            await asyncio.sleep(900 / self.clock.speedup)  # every 15 simulated minutes

    # -- the online job ----------------------------------------------------------------------

    def online_pod(self, i: int, *, image: str, reclaim: bool = False) -> JsonObj:
        pod = objects.pod(
            f"{OWNER_JOB}-{i}",
            OWNER_NS,
            gpus=1,
            priority=keys.PRIORITY_HIGH,
            owner=OWNER_JOB,
            reliability=Tier.HA,
            reclaim=reclaim,
            image=image,
        )
        pod["spec"]["containers"][0]["name"] = "trainer"
        # the job reconfigures in place after a lend or reclaim (extender.rollout)
        pod["metadata"].setdefault("labels", {})[keys.LABEL_RESTART_POLICY] = keys.RESTART_POLICY_IN_PLACE
        return pod

    async def create_policy(self) -> None:
        """The online job's ``GPULeasePolicy`` (:func:`ranker_policy`) on the extender's clock."""
        await self.store.create(Kind.GPULEASEPOLICY, ranker_policy(self.clock))

    async def policy(self) -> GPULeasePolicy:
        obj = await self.store.get(Kind.GPULEASEPOLICY, OWNER_JOB, namespace=OWNER_NS)
        return GPULeasePolicy.model_validate(obj)

    async def autopilot_lease(self, action: LeaseAction, *, limit_s: float = 120) -> JsonObj:
        """The autopilot's GPULease of ``action`` for the job, once it has written one."""

        async def written() -> JsonObj | None:
            for obj in (await self.store.list(Kind.GPULEASE, namespace=OWNER_NS)).items:
                labels = obj["metadata"].get("labels") or {}
                if labels.get(keys.LABEL_POLICY) == OWNER_JOB and obj["spec"]["action"] == action.value:
                    return obj
            return None

        return dict(await self.wait_for(f"the autopilot's {action.value}", written, limit_s=limit_s))

    async def lease_finished(self, name: str) -> JsonObj:
        """The GPULease once its phase is Done or Failed."""

        async def finished() -> JsonObj | None:
            obj = await self.store.get(Kind.GPULEASE, name, namespace=OWNER_NS)
            phase = obj.get("status", {}).get("phase")
            return obj if phase in ("Done", "Failed") else None

        return dict(await self.wait_for(f"GPULease {name} to finish", finished, limit_s=120))


def ranker_policy(clock: SimClock) -> JsonObj:
    """The online job's policy: 16 GPUs, 8 from 01:00 to 09:00 of the demo's day. The windows
    are the extender's wall clock (UTC) at those simulated hours, to the next whole minute;
    one-minute plan steps; the lead time ``auto``."""

    def hhmm(hour: float) -> str:
        at = clock.extender_time(hour * HOUR)
        if at.second or at.microsecond:
            at = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
        return at.strftime("%H:%M")

    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASEPOLICY_KIND,
        "metadata": {"name": OWNER_JOB, "namespace": OWNER_NS},
        "spec": {
            "owner": OWNER,
            "minGPUs": 8,
            "maxGPUs": 16,
            "stepSeconds": 60,
            "leadTime": "auto",
            "gracePeriodSeconds": 45,
            "stabilization": {"rho": 1, "tauSeconds": 600},
            "demand": {
                "schedule": {"timeZone": "UTC", "windows": [{"start": hhmm(1), "end": hhmm(9), "gpus": 8}]}
            },
        },
    }


async def run_day(demo: Demo, *, report: dict[str, Any], end_hour: float = 24.0) -> None:
    """The scenario until simulated hour ``end_hour`` (>= the last step, ~10:00); fills ``report``."""
    clock = demo.clock
    all_nodes = [*GENERAL, *STANDBY]

    # 00:00 the online job starts on gpu-0 and gpu-1 (its node selector)
    demo.say(f"online job {OWNER}: 16 one-GPU pods, reliability HA, priority high")
    placed: dict[int, str] = {}
    for i in range(16):
        node = await demo.schedule(demo.online_pod(i, image=demo.testbed.trainer_v1), GENERAL[:2])
        if node is None:
            raise DemoError(f"online pod {i} unschedulable: {demo.unschedulable}")
        placed[i] = node

    async def online_running() -> bool:
        pods = (await demo.store.list(Kind.POD, namespace=OWNER_NS)).items
        return len(pods) == 16 and all(p.get("status", {}).get("phase") == "Running" for p in pods)

    await demo.wait_for("the online job's pods to run", online_running, limit_s=180)
    demo.say(
        f"online job running: {sum(1 for n in placed.values() if n == 'gpu-0')} pods on gpu-0, "
        f"{sum(1 for n in placed.values() if n == LENT_NODE)} on {LENT_NODE}"
    )
    await demo.sample()
    await demo.create_policy()
    window = ranker_policy(clock)["spec"]["demand"]["schedule"]["windows"][0]
    demo.say(
        f"GPULeasePolicy {OWNER_JOB}: 8 GPUs from {window['start']} to {window['end']} UTC on the "
        "extender's clock (the demo's 01:00-09:00), 16 otherwise, lead time auto"
    )

    # 01:00 trough: the autopilot writes the Lend; the job's controller scales down gpu-1's pods
    await clock.until(0.9 * HOUR)
    lend_obj = await demo.autopilot_lease(LeaseAction.LEND)
    lend_name = lend_obj["metadata"]["name"]
    leaving = sorted(i for i, n in placed.items() if n == LENT_NODE)
    if lend_obj["spec"].get("count") != len(leaving):
        raise DemoError(
            f"the autopilot's Lend asks for {lend_obj['spec'].get('count')} GPUs, not {len(leaving)}"
        )
    holders = await demo.holders()
    lent = sorted(k for k, p in holders.items() if k.node == LENT_NODE)
    lend_at = clock.hhmm()
    demo.say(f"autopilot: GPULease {lend_name} Lend {len(leaving)}; the job scales down {LENT_NODE}'s pods")
    lend_task = asyncio.create_task(demo.lease_finished(lend_name), name="lend")
    for i in leaving:
        await demo.store.delete(Kind.POD, f"{OWNER_JOB}-{i}", namespace=OWNER_NS)
    lend = parse_gpulease(await lend_task)
    report["lend"] = {
        "lease": lend_name,
        "writtenAt": lend_at,
        "phase": lend.status.phase.value,
        "gpus": [f"{d.node}/{d.index} ({d.tier.value if d.tier else '?'})" for d in lend.status.lent],
        "message": lend.status.message,
    }
    demo.say(f"Lend {lend.status.phase.value}: {lend.status.message}")

    # 02:00 low-priority jobs arrive
    await clock.until(2 * HOUR)
    lp_nodes: dict[str, str | None] = {}
    for j in range(8):
        pod = objects.pod(
            f"finetune-{j}",
            LP_NS,
            gpus=2,
            priority=keys.PRIORITY_LOW,
            owner=f"finetune-{j}",
            image=demo.testbed.trainer_v1,
        )
        lp_nodes[f"finetune-{j}"] = await demo.schedule(pod, all_nodes)
    on_lent = sorted(n for n, node in lp_nodes.items() if node == LENT_NODE)
    report["lowPriority"] = {"pods": len(lp_nodes), "placement": lp_nodes, "onLentGPUs": on_lent}
    demo.say(
        f"8 low-priority pods × 2 GPUs placed: {sum(1 for v in lp_nodes.values() if v == 'gpu-2')} on gpu-2 "
        f"(untagged first), {len(on_lent)} on the lent GPUs of {LENT_NODE}"
    )

    # 06:00 the scripted XID 79 on gpu-1/3; wait for the agent to report it
    await clock.until(6 * HOUR)

    async def failed_seen() -> bool:
        node = (await demo.gpunodes()).get(FAILED_GPU.node)
        dev = node.status.devices.get(str(FAILED_GPU.index)) if node else None
        return dev is not None and dev.health.value == "Unhealthy"

    await demo.wait_for(f"the agent to report {FAILED_GPU} unhealthy", failed_seen, limit_s=60)
    dev = (await demo.gpunodes())[FAILED_GPU.node].status.devices[str(FAILED_GPU.index)]
    report["failure"] = {
        "gpu": str(FAILED_GPU),
        "reason": dev.reason,
        "tier": dev.tier.value,
        "at": clock.hhmm(),
    }
    demo.say(f"{FAILED_GPU} unhealthy ({dev.reason}); tier now {dev.tier.value}")

    # before the 09:00 peak, by its lead time: the autopilot's Reclaim; the job's 8 pods come back
    # onto the same GPUs, and the 8 that stayed are hot-restarted
    await clock.until(8 * HOUR)
    reclaim_obj = await demo.autopilot_lease(LeaseAction.RECLAIM)
    reclaim_name = reclaim_obj["metadata"]["name"]
    started = time.perf_counter()
    sim_started = clock.now()
    plan = (await demo.policy()).status.plan
    lead = plan.lead_time_seconds if plan is not None else None
    report["autopilot"] = {
        "policy": f"{OWNER_NS}/{OWNER_JOB}",
        "window": window,
        "lend": lend_name,
        "lendWrittenAt": lend_at,
        "reclaim": reclaim_name,
        "reclaimWrittenAt": clock.hhmm(),
        "leadTimeSeconds": lead,
        "leadTimeSource": plan.lead_time_source if plan is not None else None,
    }
    demo.say(
        f"autopilot: GPULease {reclaim_name} Reclaim {reclaim_obj['spec'].get('count')} GPUs for {OWNER} "
        f"(lead time {lead:.0f} s before the peak; grace period 45 s)"
        if lead is not None
        else f"autopilot: GPULease {reclaim_name} Reclaim"
    )
    reclaim_task = asyncio.create_task(demo.lease_finished(reclaim_name), name="reclaim")

    async def freed() -> bool:
        obj = await demo.store.get(Kind.GPULEASE, reclaim_name, namespace=OWNER_NS)
        conditions = obj.get("status", {}).get("conditions", [])
        return any(c["type"] == "GPUsFreed" and c["status"] == "True" for c in conditions)

    await demo.wait_for("the reclaimed GPUs to be freed", freed, limit_s=120)
    demo.say("LP pods on lent GPUs noticed, evicted after the grace period")
    cold: dict[str, float] = {}
    back: dict[int, str | None] = {}
    for i in leaving:
        pod = demo.online_pod(i, image=demo.testbed.trainer_v2, reclaim=True)
        back[i] = await demo.schedule(pod, all_nodes)
    reclaim = parse_gpulease(await reclaim_task)
    reclaim_real = time.perf_counter() - started
    reclaim_sim = clock.now() - sim_started
    demo.say(f"Reclaim {reclaim.status.phase.value}: {reclaim.status.message}")

    async def back_running() -> bool:
        for i in leaving:
            with contextlib.suppress(NotFound):
                pod = await demo.store.get(Kind.POD, f"{OWNER_JOB}-{i}", namespace=OWNER_NS)
                if pod.get("status", {}).get("phase") == "Running":
                    cold[pod["metadata"]["name"]] = demo.kubelet.running[pod["metadata"]["uid"]].start_seconds
                    continue
            return False
        return True

    await demo.wait_for("the reclaimed pods to run", back_running, limit_s=120)
    holders = await demo.holders()
    same = sorted(
        str(k) for k, p in holders.items() if k in set(lent) and p["metadata"]["namespace"] == OWNER_NS
    )
    report["reclaim"] = {
        "phase": reclaim.status.phase.value,
        "message": reclaim.status.message,
        "reclaimed": [f"{d.node}/{d.index}" for d in reclaim.status.reclaimed],
        "supplementedFromStandby": [
            f"{s.original.node}/{s.original.index} -> {s.replacement.node}/{s.replacement.index}"
            for s in reclaim.status.supplemented_from_standby
        ],
        "preemptedPods": reclaim.status.preempted_pods,
        "sameGPUsBack": same,
        "podsPlacedOn": {f"{OWNER_JOB}-{i}": n for i, n in back.items()},
        "realSeconds": round(reclaim_real, 2),
        "simulatedSeconds": round(reclaim_sim),
    }

    # the reclaim is done: the extender's rollout controller restarts the pods that stayed in
    # place (same image, same sandbox) so the job picks up its new GPU set (WeFlex §3.2 step e)
    async def reconfigured() -> JsonObj | None:
        obj = await demo.store.get(Kind.GPULEASE, reclaim_name, namespace=OWNER_NS)
        raw = obj["metadata"].get("annotations", {}).get(keys.ANN_ROLLOUT_STATUS)
        status = json.loads(raw) if raw else {}
        return status if status.get("phase") in ("Complete", "Failed") else None

    rollout = await demo.wait_for("the in-place reconfiguration after the reclaim", reconfigured, limit_s=120)
    report["reconfigure"] = {
        key: rollout.get(key)
        for key in ("phase", "updated", "total", "lastError", "skipped", "restartSeconds", "pauseSeconds")
    }
    demo.say(
        f"reconfiguration after the reclaim: {rollout.get('phase')}, "
        f"{rollout.get('updated')}/{rollout.get('total')} pods restarted in place"
    )

    # hot restart of the pods that stayed, onto the new model image
    stayed = sorted(i for i in placed if i not in leaving)
    request_id = "model-v2"
    before: dict[str, tuple[str, str]] = {}
    for i in stayed:
        pod = await demo.store.get(Kind.POD, f"{OWNER_JOB}-{i}", namespace=OWNER_NS)
        sandbox = demo.kubelet.running[pod["metadata"]["uid"]]
        before[pod["metadata"]["name"]] = (sandbox.sandbox_id, sandbox.pod_ip)
        ann = json.dumps({"id": request_id, "container": "trainer", "image": demo.testbed.trainer_v2})
        await demo.store.patch(
            Kind.POD,
            pod["metadata"]["name"],
            {"metadata": {"annotations": {keys.ANN_HOT_RESTART: ann}}},
            namespace=OWNER_NS,
        )
    demo.say(f"hot restart of {len(stayed)} pods onto {demo.testbed.trainer_v2}")

    async def restarted() -> dict[str, HotRestartStatus] | None:
        out: dict[str, HotRestartStatus] = {}
        for name in before:
            pod = await demo.store.get(Kind.POD, name, namespace=OWNER_NS)
            raw = pod["metadata"].get("annotations", {}).get(keys.ANN_HOT_RESTART_STATUS)
            if not raw:
                return None
            status = HotRestartStatus.model_validate_json(raw)
            if status.id != request_id or status.phase.value == "InProgress":
                return None
            out[name] = status
        return out

    statuses: dict[str, HotRestartStatus] = await demo.wait_for("hot restarts", restarted, limit_s=120)
    hot = {
        name: {
            "phase": s.phase.value,
            "totalSeconds": s.total_seconds,
            "pullSeconds": s.pull_seconds,
            "stopSeconds": s.stop_seconds,
            "startSeconds": s.start_seconds,
            "sameSandbox": s.sandbox_id == before[name][0],
            "samePodIP": s.pod_ip == before[name][1],
            "message": s.message,
        }
        for name, s in statuses.items()
    }
    report["hotRestart"] = hot
    report["coldStartSeconds"] = cold
    ok = [h for h in hot.values() if h["phase"] == "Succeeded"]
    demo.say(f"hot restarts: {len(ok)}/{len(hot)} succeeded in the same sandbox and IP")
    await demo.sample()

    # the rest of the day
    await clock.until(end_hour * HOUR)
    await demo.sample()


def plot(demo: Demo, out: Path) -> Path:
    """``gpu-timeline.png``: every GPU's state over the day, and the online job's HA share."""
    states = ["free", "standby", "online job", "lent (tagged, free)", "low priority", "unhealthy"]
    colors = ["#e8e8e8", "#b8d4f0", "#1f77b4", "#9edae5", "#ff7f0e", "#d62728"]
    gpus = list(demo.timeline[-1][1]) if demo.timeline else []
    grid = [[states.index(snap.get(g, "free")) for _, snap in demo.timeline] for g in gpus]
    times = [t / HOUR for t, _ in demo.timeline]
    fig = Figure(figsize=(10, 8))
    ax, ax2 = fig.subplots(2, 1, height_ratios=[3, 1], sharex=True)
    if grid:
        ax.imshow(
            grid,
            aspect="auto",
            interpolation="nearest",
            cmap=ListedColormap(colors),
            vmin=0,
            vmax=len(states) - 1,
            extent=(times[0], times[-1] if len(times) > 1 else times[0] + 1, len(gpus), 0),
        )
    ax.set_yticks([i + 0.5 for i in range(len(gpus))], gpus, fontsize=6)
    ax.set_title("flexlease demo: GPU states over one accelerated day")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors]
    ax.legend(handles, states, loc="upper right", fontsize=7, ncols=3)
    ax2.plot(
        [t / HOUR for t, _ in demo.ha_share], [s * 100 for _, s in demo.ha_share], drawstyle="steps-post"
    )
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("online job HA share %")
    ax2.set_xlabel("simulated hour of day")
    fig.tight_layout()
    path = out / "gpu-timeline.png"
    fig.savefig(path, dpi=110)
    return path


def print_report(report: dict[str, Any]) -> None:
    lend, lp, fail, rec = report["lend"], report["lowPriority"], report["failure"], report["reclaim"]
    auto = report["autopilot"]
    hot = report["hotRestart"]
    totals = sorted(h["totalSeconds"] for h in hot.values() if h["totalSeconds"] is not None)
    cold = sorted(report["coldStartSeconds"].values())
    succeeded = sum(h["phase"] == "Succeeded" for h in hot.values())
    same_sandbox = all(h["sameSandbox"] for h in hot.values())
    same_ip = all(h["samePodIP"] for h in hot.values())
    lines = [
        "",
        "== flexlease demo report",
        f"autopilot:     GPULeasePolicy {auto['policy']} (8 GPUs {auto['window']['start']}-"
        f"{auto['window']['end']} UTC): Lend {auto['lend']} at {auto['lendWrittenAt']}, Reclaim "
        f"{auto['reclaim']} at {auto['reclaimWrittenAt']} (lead time {auto['leadTimeSeconds']} s)",
        f"lent:          {len(lend['gpus'])} GPUs of {LENT_NODE} to the platform, tagged for {OWNER}",
        f"low priority:  {lp['pods']} pods × 2 GPUs; on lent GPUs: {', '.join(lp['onLentGPUs']) or 'none'}",
        f"failure:       {fail['gpu']} at {fail['at']}: {fail['reason']} (tier {fail['tier']})",
        f"reclaim:       {rec['phase']} in {rec['simulatedSeconds']} simulated s "
        f"({rec['realSeconds']} s real)",
        f"  reclaimed:   {len(rec['reclaimed'])} GPUs; "
        f"lent GPUs back with the job: {len(rec['sameGPUsBack'])}",
        f"  supplemented from standby: {', '.join(rec['supplementedFromStandby']) or 'none'}",
        f"  preempted LP pods: {', '.join(rec['preemptedPods']) or 'none'}",
    ]
    if totals:
        lines.append(
            f"hot restarts:  {succeeded}/{len(hot)} succeeded, median {totals[len(totals) // 2]:.3f} s "
            f"(same sandbox: {same_sandbox}, same pod IP: {same_ip})"
        )
    rc = report.get("reconfigure") or {}
    if rc:
        per_pod = ", ".join(
            f"{name.rsplit('-', 1)[-1]}: {seconds:.3f}"
            for name, seconds in sorted(rc["restartSeconds"].items())
        )
        lines.append(
            f"reconfigure:   {rc['phase']}, {rc['updated']}/{rc['total']} pods restarted in place after the "
            f"reclaim by the extender's rollout (s per pod {per_pod})"
        )
    if cold:
        lines.append(
            f"new pods:      median {cold[len(cold) // 2]:.3f} s for a new sandbox + container, image "
            "already local (a full recreate with pull + checkpoint: hack/bench_restart.py)"
        )
    dp = report["devicePlugin"]
    lines.append(
        f"device plugin: {dp['onAssignedGPUs']}/{dp['pods']} pods ran on exactly their assigned GPUs "
        "(GetPreferredAllocation → Allocate over gRPC; NVIDIA_VISIBLE_DEVICES = assigned-uuids)"
    )
    lines += [
        f"HA share:      {report['haShare']}",
        f"extender:      {report['extenderCalls']}",
        f"report:        {report['paths']['report']}",
        f"plot:          {report['paths']['plot']}",
    ]
    print("\n".join(lines))


async def amain(args: argparse.Namespace) -> int:
    testbed = Testbed.from_env(dict(os.environ))
    out: Path = args.out
    db = out / "state.db"
    store = SqliteStore(db, poll_seconds=0.01)
    await store.open()
    for name in (*GENERAL, *STANDBY):  # operators set the pool; agents fill the status
        await store.create(
            Kind.GPUNODE, objects.gpunode(name, pool=Pool.STANDBY if name in STANDBY else Pool.GENERAL)
        )
    print(f"== flexlease demo: 1 day at {args.speedup:g}× (1 simulated hour = {HOUR / args.speedup:.1f} s)")
    report: dict[str, Any] = {"speedup": args.speedup}
    origin = time.time()  # the extender's accelerated clock is pinned here (clock_origin)
    async with (
        running_extender(
            db,
            out / "extender.log",
            speedup=args.speedup,
            log_level="INFO",
            extra_env={
                "FLEXLEASE_LEASE__RESYNC_SECONDS": "60",
                # the extender's clock runs --speedup times faster (a real second is 900
                # simulated ones at the default): the reconfiguration after a lease may start
                # up to a simulated day after it completed (the leases all start after the extender)
                "FLEXLEASE_LEASE__RECONFIGURE_MAX_AGE_SECONDS": "86400",
                # the demo knows the extender's time exactly, to write the policy's windows
                "FLEXLEASE_CLOCK_ORIGIN": f"{origin:.6f}",
                "FLEXLEASE_AUTOPILOT__RESYNC_SECONDS": "60",
            },
        ) as extender,
        ExtenderClient(extender.url) as client,
        GrpcCri(testbed.endpoint, timeout_seconds=20, pull_timeout_seconds=120) as cri,
    ):
        await cri.connect()
        clock = SimClock(
            args.speedup, origin=origin
        )  # 00:00: the agents' scripted GPU events count from here
        nodes = [*GENERAL, *STANDBY]
        async with (
            device_kubelets(nodes) as kubelets,
            running_agents(nodes, out=out, db=db, testbed=testbed, speedup=args.speedup, kubelets=kubelets),
        ):
            await run_agents_day(
                store,
                client,
                cri=cri,
                clock=clock,
                testbed=testbed,
                report=report,
                out=out,
                end_hour=args.end_hour,
                kubelets=kubelets,
            )
    await store.close()
    await asyncio.to_thread((out / "report.json").write_text, json.dumps(report, indent=2, default=str))
    print_report(report)
    return 0


async def run_agents_day(
    store: SqliteStore,
    client: ExtenderClient,
    *,
    cri: GrpcCri,
    clock: SimClock,
    testbed: Testbed,
    report: dict[str, Any],
    out: Path,
    end_hour: float,
    kubelets: dict[str, DeviceKubelet],
) -> None:
    """With extender and agents running: wait for the agents' reports and their device plugins'
    registrations, play the day, fill ``report``."""
    demo = Demo(store, client, Kubelet(cri, testbed, store, kubelets), clock, testbed)

    async def nodes_reported() -> bool:
        nodes = await demo.gpunodes()
        return len(nodes) == 4 and all(len(n.status.devices) == GPUS_PER_NODE for n in nodes.values())

    print("  waiting for 4 agents to report 32 GPUs and register their device plugins")
    await demo.wait_for("agents to report their GPUs", nodes_reported, limit_s=120)
    for name, node_kubelet in kubelets.items():
        try:
            await node_kubelet.wait_registered(keys.DEFAULT_GPU_RESOURCE, limit_s=60)
            await node_kubelet.wait_devices(
                keys.DEFAULT_GPU_RESOURCE,
                lambda d: len(d) == GPUS_PER_NODE and all(h == "Healthy" for h in d.values()),
                limit_s=60,
            )
        except TimeoutError as exc:
            raise DemoError(
                f"the device plugin of {name} did not register {GPUS_PER_NODE} healthy GPUs"
            ) from exc
    try:
        async with asyncio.TaskGroup() as group:
            kubelet = group.create_task(demo.kubelet.loop(), name="kubelet")
            sampler = group.create_task(demo.sampler(), name="sampler")
            try:
                await run_day(demo, report=report, end_hour=end_hour)
            finally:
                kubelet.cancel()
                sampler.cancel()
    finally:
        await demo.kubelet.teardown()
    report["haShare"] = {
        "start": round(demo.ha_share[0][1], 3) if demo.ha_share else None,
        "end": round(demo.ha_share[-1][1], 3) if demo.ha_share else None,
        "min": round(min(s for _, s in demo.ha_share), 3) if demo.ha_share else None,
    }
    report["extenderCalls"] = client.stats.as_dict()
    report["kubeletErrors"] = demo.kubelet.errors
    checks = demo.kubelet.checks
    report["devicePlugin"] = {
        "pods": len(checks),
        "onAssignedGPUs": sum(c.exact for c in checks),
        "mismatched": [
            {
                "pod": c.pod,
                "node": c.node,
                "assigned": c.assigned,
                "allocated": c.allocated,
                "visible": c.visible,
            }
            for c in checks
            if not c.exact
        ],
        "registrations": {n: len(k.registrations) for n, k in kubelets.items()},
    }
    report["unschedulable"] = demo.unschedulable
    report["events"] = [f"{t} {m}" for t, m in demo.events]
    report["paths"] = {"report": str(out / "report.json"), "plot": str(plot(demo, out)), "logs": str(out)}


def fresh_out(out: Path) -> None:
    """Prepare ``out`` for a fresh day: the previous run's store and its agents' state
    (availability ledgers, checkpoint caches, logs, node configs) go; report and plot are
    overwritten later. Every run replays the same day from its start, so an agent must not
    inherit the last run's health: a GPU left unhealthy at the end of that day would start
    this one in recovery hold-down, and its device plugin would report 7 healthy GPUs."""
    out.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{out / 'state.db'}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(out / "agents", ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="report, plot, logs, state")
    parser.add_argument("--speedup", type=float, default=900.0, help="simulated seconds per real second")
    parser.add_argument("--end-hour", type=float, default=24.0, help="stop the day at this simulated hour")
    args = parser.parse_args(argv)
    fresh_out(args.out)
    try:
        return asyncio.run(amain(args))
    except (DemoError, FlexleaseError, ExtenderCallError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
