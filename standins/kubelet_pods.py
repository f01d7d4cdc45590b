"""A stand-in kubelet for the container lifecycle: runs the pods a store binds to its node on a
real CRI runtime, the way kubelet's ``kuberuntime`` manager does, in the details that hot
restart meets (kubelet v1.36 ``pkg/kubelet/kuberuntime``, ``pkg/kubelet/container``,
client-go ``util/flowcontrol/backoff.go``):

* Sandboxes carry ``io.kubernetes.pod.{name,namespace,uid}`` plus the pod's labels, and no
  ``flexlease.io/no-kubelet`` (kubelet knows nothing of it).
* Containers are created with the **image ID** (``sha256:…``, CRI ``ImageStatus`` after an
  ensure-pull), with the spec's reference only in ``ImageSpec.user_specified_image``; they
  carry the annotations ``io.kubernetes.container.hash`` (hex hash of the container spec),
  ``io.kubernetes.container.restartCount`` (= ``metadata.attempt``) and
  ``io.kubernetes.pod.terminationGracePeriod``; logs at ``<name>/<restartCount>.log``.
* **Spec change**: a running container whose hash differs from the spec's is killed with the
  pod's ``terminationGracePeriodSeconds`` (default 30) and started again from the spec,
  whatever the ``restartPolicy`` ("Container … definition changed, will be restarted").
* **Restart**: the newest container of a name (by creation) that is not running is restarted
  when ``ShouldContainerBeRestarted`` says so: always when ``Created``/``Unknown`` (so a
  replacement someone else created but has not started yet makes it start its own — the
  ``direct`` race), never for ``Never``, only on a non-zero exit code for ``OnFailure``.
* **Crash-loop back-off** per pod, container and spec hash: the first restart is at once and
  arms 10 s; a restart while ``now − exit < back-off`` waits (a ``BackOff`` event, "back-off
  10s restarting failed container=…"); each restart doubles it up to 300 s; an entry not
  updated for 2 × 300 s (10 min) starts from 10 s again.
* **Pod end**: when every container has exited and none is to be restarted, the pod's phase
  becomes ``Succeeded`` (all exit codes 0) or ``Failed`` and the sandbox is stopped.
* Container GC keeps the newest dead container of each name (``MaxPerPodContainer`` = 1).
* **Errors stay with their pod** (``pkg/kubelet/pod_workers.go``): a CRI or store error in one
  pod's sync is recorded and that pod is synced again after the pod worker's ``backOffPeriod``
  (10 s; kubelet adds up to 50 % jitter), or at once when the pod changes, while the other
  pods go on. A sandbox that cannot be
  created records ``FailedCreatePodSandBox``; a container that cannot be created or started,
  ``Failed`` ("Error: …"). An image that cannot be pulled records ``Failed`` ("Failed to pull
  image …") and enters the image back-off (``pkg/kubelet/images``: per pod and image, 10 s
  doubling to 300 s, the same ``flowcontrol.Backoff``); a sync within it pulls nothing and
  records ``BackOff`` ("Back-off pulling image …", the pod's ``ImagePullBackOff``).

* **Container statuses** (``status.containerStatuses``, written by the stand-in as kubelet's
  status manager does, JSON merge patch of the status subresource when they change): per
  spec container ``name``, ``image`` (the spec's), ``imageID``, ``containerID``
  (``containerd://…``), ``restartCount``, ``ready``/``started``, ``state`` and ``lastState``.
  ``state`` is ``running``; else ``waiting`` with the reason of the last sync
  (kubelet's reason cache: ``CrashLoopBackOff`` while in back-off, ``ErrImagePull`` /
  ``ImagePullBackOff``, ``CreateContainerConfigError`` when the container's options could
  not be generated, ``CreateContainerError``, ``RunContainerError`` when StartContainer
  failed), the last exit in ``lastState``; else ``terminated`` (exit code, reason such as
  containerd's ``StartError`` with exit code 128, message); else ``waiting``
  (``ContainerCreating``).
* **PLEG**: a pod whose containers changed state since the previous pass (a container died,
  even one the last sync created) is synced at once, even within the pod worker's back-off;
  so a container whose start failed (``StartError``) shows ``CrashLoopBackOff`` right after.
* **Devices** (with a :class:`standins.kubelet_devices.DeviceKubelet`): a pod whose
  containers' limits name extended resources (``<domain>/<name>``) is admitted through the
  device manager before its sandbox is run (Allocate; one such resource per pod); a pod it
  rejects ends ``Failed`` (``UnexpectedAdmissionError``). Before each start of a container the
  device manager's ``PreStartContainer`` step runs; when it fails (a plugin that requires it
  is gone) the container is not created: ``Failed`` event ``Error: device plugin
  PreStartContainer rpc failed with err: endpoint … has been stopped`` and the waiting reason
  ``CreateContainerConfigError``, retried after the back-off. The plugin's environment
  variables go into the container; its device nodes and mounts do not (no GPU here).

Where it differs: it polls (:meth:`StandInKubelet.sync_once`, or :meth:`run` every
``period_seconds``) instead of reacting to PLEG; an exit's time is when it first saw the
container exited, on its own ``clock`` (kubelet uses the runtime's ``finished_at`` on its
clock), so tests drive back-off with a fake clock; the spec hash is FNV-32a of the container's
canonical JSON (kubelet hashes its Go JSON: the same property — any change to the container
spec, its image string included, changes the hash); volumes other than none are not mounted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from flexlease import errors
from flexlease.clock import format_time
from flexlease.cri import api_pb2
from flexlease.store.base import JsonObj, Kind, Selector, Store
from nodeagent.cri import podspec
from nodeagent.cri.client import (
    ANN_CONTAINER_HASH,
    ANN_CONTAINER_RESTART_COUNT,
    ANN_POD_TERMINATION_GRACE_PERIOD,
    ContainerInfo,
    ContainerState,
    GrpcCri,
)
from standins.kubelet_devices import AdmissionError, DeviceKubelet, PreStartError

log = logging.getLogger(__name__)

BACKOFF_INITIAL_SECONDS: Final = 10.0
"""kubelet's ``backOffPeriod`` (pkg/kubelet/kubelet.go)."""
BACKOFF_MAX_SECONDS: Final = 300.0
"""kubelet's ``MaxContainerBackOff``."""
SYNC_BACKOFF_SECONDS: Final = 10.0
"""How long a pod whose sync failed waits before the next one: the pod worker's
``backOffPeriod`` (kubelet waits 10–15 s, ``workerBackOffPeriodJitterFactor`` 0.5; the stand-in
the lower bound, so tests can step its clock)."""
DEFAULT_GRACE_SECONDS: Final = 30
"""The API server's default ``terminationGracePeriodSeconds``."""

# Waiting reasons (pkg/kubelet/container/sync_result.go, pkg/kubelet/images/types.go).
CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
ERR_IMAGE_PULL: Final = "ErrImagePull"
IMAGE_PULL_BACK_OFF: Final = "ImagePullBackOff"
CREATE_CONTAINER_CONFIG_ERROR: Final = "CreateContainerConfigError"
CREATE_CONTAINER_ERROR: Final = "CreateContainerError"
RUN_CONTAINER_ERROR: Final = "RunContainerError"
CONTAINER_CREATING: Final = "ContainerCreating"


class StartFailed(errors.CriError):
    """A container could not be started; ``reason`` is kubelet's waiting reason for it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Backoff:
    """client-go ``flowcontrol.Backoff`` without jitter, on an injectable ``clock`` (seconds).

    ``is_in_backoff_since(key, t)``: an entry exists, was updated within 2 × ``maximum`` of
    ``t``, and ``clock() − t`` < its back-off. ``next(key, t)``: a new or expired entry gets
    ``initial``, else the back-off doubles up to ``maximum``; the entry's update time is
    ``clock()``.
    """

    def __init__(
        self,
        *,
        initial: float = BACKOFF_INITIAL_SECONDS,
        maximum: float = BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._clock = clock
        self._entries: dict[str, tuple[float, float]] = {}

    def _expired(self, event_time: float, last_update: float) -> bool:
        return event_time - last_update > 2 * self.maximum

    def get(self, key: str) -> float:
        """The current back-off of ``key`` in seconds (0 when none)."""
        entry = self._entries.get(key)
        return entry[0] if entry else 0.0

    def is_in_backoff_since(self, key: str, event_time: float) -> bool:
        entry = self._entries.get(key)
        if entry is None or self._expired(event_time, entry[1]):
            return False
        return self._clock() - event_time < entry[0]

    def is_in_backoff_since_update(self, key: str, event_time: float) -> bool:
        """``IsInBackOffSinceUpdate``: an entry exists, is not expired at ``event_time``, and
        ``event_time`` is less than its back-off after the entry's last update."""
        entry = self._entries.get(key)
        if entry is None or self._expired(event_time, entry[1]):
            return False
        return event_time - entry[1] < entry[0]

    def next(self, key: str, event_time: float) -> None:
        entry = self._entries.get(key)
        if entry is None or self._expired(event_time, entry[1]):
            backoff = self.initial
        else:
            backoff = min(entry[0] * 2, self.maximum)
        self._entries[key] = (backoff, self._clock())


def hash_container(container: JsonObj) -> str:
    """The container spec's hash, hex (FNV-32a of its canonical JSON; see the module
    docstring for how it relates to kubelet's ``HashContainer``)."""
    data = json.dumps(container, sort_keys=True, separators=(",", ":")).encode()
    h = 0x811C9DC5
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return format(h, "x")


@dataclass(frozen=True, slots=True)
class KubeletEvent:
    """An Event kubelet would record: ``reason`` (``Created``, ``Started``, ``Killing``,
    ``BackOff``, ``Failed``, ``FailedCreatePodSandBox``), the container (``""`` for the
    sandbox), the message; ``at``: the stand-in's clock."""

    pod: str
    reason: str
    container: str
    message: str
    at: float


@dataclass
class _PodState:
    sandbox_id: str
    sandbox_config: api_pb2.PodSandboxConfig
    ref: podspec.PodRef
    phase: str = "Running"
    exits: dict[str, float] = field(default_factory=dict)  # container id → first seen exited
    reasons: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Container name → (waiting reason, message) of the last sync (kubelet's reason cache)."""
    statuses: list[JsonObj] | None = None
    """The container statuses last written to the pod."""


class StandInKubelet:
    """Runs the pods ``store`` binds to ``node`` on the CRI runtime ``cri``.

    ``log_root``, ``cgroup_parent``: where sandboxes put logs and cgroups (the testbed's).
    ``clock``: seconds, for back-off and event times. ``period_seconds``: :meth:`run`'s sync
    period. ``devices``: kubelet's device manager (admission, PreStartContainer), None for
    pods without devices. :attr:`events` lists what kubelet would have recorded;
    :attr:`starts` counts the containers it started.
    """

    def __init__(
        self,
        cri: GrpcCri,
        store: Store,
        *,
        node: str,
        log_root: Path,
        cgroup_parent: str = "",
        clock: Callable[[], float] = time.monotonic,
        period_seconds: float = 0.05,
        devices: DeviceKubelet | None = None,
    ) -> None:
        self.cri = cri
        self.devices = devices
        self.store = store
        self.node = node
        self.log_root = log_root
        self.cgroup_parent = cgroup_parent
        self.clock = clock
        self.period_seconds = period_seconds
        self.backoff = Backoff(clock=clock)
        self.image_backoff = Backoff(clock=clock)
        self.events: list[KubeletEvent] = []
        self.sync_errors = 0
        """Pod syncs that failed (each retried after :data:`SYNC_BACKOFF_SECONDS`)."""
        self._retry_at: dict[str, tuple[str, float]] = {}
        """Pod uid → (the resourceVersion whose sync failed, when to sync it again)."""
        self.starts = 0
        self._pods: dict[str, _PodState] = {}
        self._rejected: set[str] = set()
        """Uids of pods the device manager refused (phase Failed)."""
        self._relisted: dict[str, frozenset[tuple[str, ContainerState]]] = {}
        """Sandbox id → its containers' (id, state) at the previous pass (PLEG's relist)."""

    def sandbox_id(self, namespace: str, name: str) -> str:
        """The sandbox the stand-in runs for the pod. Raises ``KeyError`` before the first sync."""
        return self._pods[f"{namespace}/{name}"].sandbox_id

    def phase(self, namespace: str, name: str) -> str:
        """The pod's phase as the stand-in sees it (``Running``, ``Succeeded``, ``Failed``)."""
        return self._pods[f"{namespace}/{name}"].phase

    async def remove_all(self) -> None:
        """Stop and remove every sandbox the stand-in ran (test teardown)."""
        for state in self._pods.values():
            try:
                await self.cri.stop_pod_sandbox(state.sandbox_id)
                await self.cri.remove_pod_sandbox(state.sandbox_id)
            except errors.CriNotFound:
                continue
        self._pods.clear()

    async def run(self) -> None:
        """Sync every ``period_seconds`` until cancelled. A pass that cannot list the node's
        pods is logged and the next period tries again (kubelet keeps running its pods while
        the API server is away); a pod's own errors stay with that pod (:meth:`sync_once`)."""
        while True:
            try:
                await self.sync_once()
            except errors.StoreError as exc:
                log.warning("listing the node's pods failed", extra={"node": self.node, "error": str(exc)})
            await asyncio.sleep(self.period_seconds)

    async def sync_once(self) -> None:
        """One pass over the node's pods (SyncPod for each, but not for a pod whose last sync
        failed less than :data:`SYNC_BACKOFF_SECONDS` ago unless it changed or its containers
        did — PLEG), then each pod's container statuses written when they changed. A pod's
        CRI or store error is logged and counted (:attr:`sync_errors`) and does not stop the
        pass. Raises ``StoreError`` when the pods cannot be listed."""
        listed = await self.store.list(Kind.POD, selector=Selector(fields={"spec.nodeName": self.node}))
        uids = {str(p["metadata"].get("uid") or "") for p in listed.items}
        for gone in set(self._retry_at) - uids:
            del self._retry_at[gone]
        relist = await self._relist()
        for pod in listed.items:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
            if uid in self._rejected:
                continue
            state = self._pods.get(key)
            changed = state is not None and relist.get(state.sandbox_id) != self._relisted.get(
                state.sandbox_id
            )
            failed = self._retry_at.get(uid)
            if failed is not None and failed[0] == version and self.clock() < failed[1] and not changed:
                continue  # in back-off; an update of the pod (or PLEG) syncs it at once, as kubelet does
            error: Exception | None = None
            try:
                await self.sync_pod(pod)
            except (errors.CriError, errors.StoreError, PreStartError) as exc:
                error = exc
            written = await self._write_statuses(pod)
            if error is not None:
                self.sync_errors += 1
                self._retry_at[uid] = (written or version, self.clock() + SYNC_BACKOFF_SECONDS)
                log.warning(
                    "pod sync failed; retrying after the back-off",
                    extra={
                        "pod": key,
                        "node": self.node,
                        "error": str(error),
                        "retry_s": SYNC_BACKOFF_SECONDS,
                    },
                )
            else:
                self._retry_at.pop(uid, None)
        self._relisted = relist

    async def _relist(self) -> dict[str, frozenset[tuple[str, ContainerState]]]:
        """PLEG's relist: each sandbox's containers (id, state)."""
        seen: dict[str, set[tuple[str, ContainerState]]] = {}
        for c in await self.cri.list_containers():
            seen.setdefault(c.sandbox_id, set()).add((c.id, c.state))
        return {sandbox: frozenset(found) for sandbox, found in seen.items()}

    async def sync_pod(self, pod: JsonObj) -> None:
        """SyncPod: run the sandbox, kill changed containers, (re)start what should run,
        end the pod when nothing will run again, collect dead containers."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        state = self._pods.get(key)
        if state is None:
            if not await self._admit(pod):
                return
            try:
                state = await self._run_sandbox(pod)
            except errors.CriError as exc:
                self._event(key, "FailedCreatePodSandBox", "", f"Failed to create pod sandbox: {exc}")
                raise
            self._pods[key] = state
        if state.phase != "Running":
            return
        spec = pod.get("spec") or {}
        policy = str(spec.get("restartPolicy") or "Always")
        grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        found = await self.cri.list_containers(sandbox_id=state.sandbox_id)
        done: list[ContainerInfo] = []
        failures: list[str] = []
        for container in spec.get("containers") or []:
            name = container["name"]
            try:
                mine = sorted(
                    (c for c in found if c.name == name), key=lambda c: c.created_at_ns, reverse=True
                )
                for c in mine:
                    if c.state is ContainerState.EXITED:
                        state.exits.setdefault(c.id, self.clock())
                await self._gc(mine)
                latest = mine[0] if mine else None
                wanted = hash_container(container)
                if latest is not None and latest.state is ContainerState.RUNNING:
                    if latest.annotations.get(ANN_CONTAINER_HASH) != wanted:
                        self._event(
                            key, "Killing", name, f"Container {name} definition changed, will be restarted"
                        )
                        await self.cri.stop_container(latest.id, timeout_seconds=grace)
                        state.exits[latest.id] = self.clock()
                        await self._start(pod, state, container, wanted, restart_count=latest.attempt + 1)
                    continue
                if latest is None:
                    await self._start(pod, state, container, wanted, restart_count=0)
                    continue
                if latest.state is ContainerState.EXITED:
                    latest = await self.cri.container_status(latest.id)  # exit code
                    if not _should_restart(policy, latest):
                        done.append(latest)
                        continue
                    backoff_key = f"{meta['name']}_{meta['namespace']}_{meta['uid']}_{name}_{wanted}"
                    exited_at = state.exits.get(latest.id, self.clock())
                    if self.backoff.is_in_backoff_since(backoff_key, exited_at):
                        message = (
                            f"back-off {self.backoff.get(backoff_key):g}s restarting failed container={name} "
                            f"pod={meta['name']}_{meta['namespace']}({meta['uid']})"
                        )
                        self._event(key, "BackOff", name, message)
                        state.reasons[name] = (CRASH_LOOP_BACK_OFF, message)
                        continue
                    self.backoff.next(backoff_key, exited_at)
                # Created or Unknown (someone else's replacement not started yet) or a restart.
                await self._start(pod, state, container, wanted, restart_count=latest.attempt + 1)
            except (errors.CriError, PreStartError) as exc:  # kubelet starts the others all the same
                failures.append(f"{name}: {exc}")
        if failures:  # SyncPod's result: every container's error together
            raise errors.CriError("; ".join(failures))
        containers = spec.get("containers") or []
        if containers and len(done) == len(containers):
            await self._end(pod, state, done)

    async def _admit(self, pod: JsonObj) -> bool:
        """The device manager's admission of a pod whose containers' limits name extended
        resources (``<domain>/<name>``); False when it refused the pod, which then ends
        ``Failed`` (``UnexpectedAdmissionError``). Raises ``StoreError``."""
        meta = pod["metadata"]
        containers = (pod.get("spec") or {}).get("containers") or []
        wanted = {
            str(c["name"]): {
                r: int(v) for r, v in ((c.get("resources") or {}).get("limits") or {}).items() if "/" in r
            }
            for c in containers
        }
        resources = {r for limits in wanted.values() for r in limits}
        if not resources:
            return True
        try:
            if self.devices is None or len(resources) > 1:
                raise AdmissionError(
                    f"the stand-in admits one device resource per pod, not {sorted(resources)}"
                )
            [resource] = resources
            requests = [(name, limits.get(resource, 0)) for name, limits in wanted.items()]
            await self.devices.admit(meta["namespace"], meta["name"], requests, resource=resource)
        except AdmissionError as exc:
            await self.store.patch(
                Kind.POD,
                meta["name"],
                {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": str(exc)}},
                namespace=meta["namespace"],
                subresource="status",
            )
            self._rejected.add(str(meta.get("uid") or ""))
            log.warning(
                "pod rejected at admission",
                extra={"pod": f"{meta['namespace']}/{meta['name']}", "error": str(exc)},
            )
            return False
        return True

    async def _run_sandbox(self, pod: JsonObj) -> _PodState:
        meta = pod["metadata"]
        ref = podspec.PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
        config = podspec.sandbox_config(
            ref,
            self.log_root,
            cgroup_parent=self.cgroup_parent,
            labels=meta.get("labels") or {},
            no_kubelet=False,
        )
        sandbox_id = await self.cri.run_pod_sandbox(config)
        return _PodState(sandbox_id, config, ref)

    async def _image_id(self, pod: str, uid: str, container: str, image: str) -> str:
        """EnsureImageExists: the image ID, pulling when the image is not on the node, unless
        a pull of it for this pod failed within the image back-off. Raises ``CriError``
        (:class:`StartFailed` with ``ErrImagePull`` or ``ImagePullBackOff``)."""
        info = await self.cri.image_status(image)
        if info is None:
            backoff_key = f"{uid}_{image}"
            now = self.clock()
            if self.image_backoff.is_in_backoff_since_update(backoff_key, now):
                message = f'Back-off pulling image "{image}"'
                self._event(pod, "BackOff", container, message)
                raise StartFailed(IMAGE_PULL_BACK_OFF, f"ImagePullBackOff: {message}")
            try:
                await self.cri.pull_image(image)
            except errors.CriError as exc:
                self.image_backoff.next(backoff_key, now)
                message = f'Failed to pull image "{image}": {exc}'
                self._event(pod, "Failed", container, message)
                raise StartFailed(ERR_IMAGE_PULL, message) from exc
            info = await self.cri.image_status(image)
            if info is None:
                raise errors.CriError(f"{image}: pulled but ImageStatus finds nothing")
        return info.id

    async def _start(
        self, pod: JsonObj, state: _PodState, container: JsonObj, spec_hash: str, *, restart_count: int
    ) -> str:
        """startContainer: pull, generate the options (the device manager's PreStartContainer),
        create, start. The waiting reason of a failure is kept for the container's status.
        Raises ``CriError`` or :class:`~standins.kubelet_devices.PreStartError`."""
        name = container["name"]
        try:
            cid = await self._create_and_start(pod, state, container, spec_hash, restart_count=restart_count)
        except StartFailed as exc:
            state.reasons[name] = (exc.reason, str(exc))
            raise
        except PreStartError as exc:
            state.reasons[name] = (CREATE_CONTAINER_CONFIG_ERROR, str(exc))
            raise
        state.reasons.pop(name, None)
        return cid

    async def _create_and_start(
        self, pod: JsonObj, state: _PodState, container: JsonObj, spec_hash: str, *, restart_count: int
    ) -> str:
        name = container["name"]
        key = f"{state.ref.namespace}/{state.ref.name}"
        image_id = await self._image_id(key, state.ref.uid, name, container["image"])
        env = {str(e["name"]): str(e.get("value", "")) for e in container.get("env") or []}
        if self.devices is not None:
            try:  # GenerateRunContainerOptions → GetDeviceRunContainerOptions
                await self.devices.pre_start_container(state.ref.namespace, state.ref.name, name)
            except PreStartError as exc:
                self._event(key, "Failed", name, f"Error: {exc}")
                raise
            for allocation in self.devices.allocations(state.ref.namespace, state.ref.name).get(name, ()):
                env.update(allocation.response.envs)
        spec = podspec.ContainerSpec(
            name=name,
            image=image_id,
            command=tuple(container.get("command") or ()),
            args=tuple(container.get("args") or ()),
            env=env,
        )
        config = podspec.container_config(state.ref, spec, attempt=restart_count)
        config.image.user_specified_image = container["image"]
        grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        config.annotations[ANN_CONTAINER_HASH] = spec_hash
        config.annotations[ANN_CONTAINER_RESTART_COUNT] = str(restart_count)
        config.annotations[ANN_POD_TERMINATION_GRACE_PERIOD] = str(grace)
        try:
            cid = await self.cri.create_container(state.sandbox_id, config, state.sandbox_config)
        except errors.CriError as exc:
            self._event(key, "Failed", name, f"Error: {exc}")
            raise StartFailed(CREATE_CONTAINER_ERROR, str(exc)) from exc
        self._event(key, "Created", name, f"Created container {name}")
        try:
            await self.cri.start_container(cid)
        except errors.CriError as exc:
            self._event(key, "Failed", name, f"Error: {exc}")
            raise StartFailed(RUN_CONTAINER_ERROR, str(exc)) from exc
        self._event(key, "Started", name, f"Started container {name} ({image_id}, attempt {restart_count})")
        self.starts += 1
        return cid

    async def _gc(self, newest_first: list[ContainerInfo]) -> None:
        """Keep the newest dead container of the name, remove older dead ones."""
        dead = [c for c in newest_first if c.state is ContainerState.EXITED]
        for c in dead[1:]:
            try:
                await self.cri.remove_container(c.id)
            except errors.CriNotFound:
                continue

    async def _end(self, pod: JsonObj, state: _PodState, exited: list[ContainerInfo]) -> None:
        meta = pod["metadata"]
        phase = "Succeeded" if all(c.exit_code == 0 for c in exited) else "Failed"
        await self.cri.stop_pod_sandbox(state.sandbox_id)  # idempotent: a retry stops it again
        await self.store.patch(
            Kind.POD,
            meta["name"],
            {"status": {"phase": phase}},
            namespace=meta["namespace"],
            subresource="status",
        )
        state.phase = phase  # only once recorded: a failed stop or patch is retried
        log.info("pod ended", extra={"pod": f"{meta['namespace']}/{meta['name']}", "phase": phase})

    async def _write_statuses(self, pod: JsonObj) -> str | None:
        """Write the pod's ``status.containerStatuses`` when they changed (see the module
        docstring); the pod's resourceVersion after the write, None when nothing was written
        (a failed write is logged and tried again at the next pass)."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        state = self._pods.get(key)
        if state is None:
            return None
        try:
            statuses = await self._container_statuses(pod, state)
            if statuses == state.statuses:
                return None
            written = await self.store.patch(
                Kind.POD,
                meta["name"],
                {"status": {"containerStatuses": statuses}},
                namespace=meta["namespace"],
                subresource="status",
            )
        except (errors.CriError, errors.StoreError) as exc:
            log.warning("container statuses not written", extra={"pod": key, "error": str(exc)})
            return None
        state.statuses = statuses
        return str(written["metadata"].get("resourceVersion") or "") or None

    async def _container_statuses(self, pod: JsonObj, state: _PodState) -> list[JsonObj]:
        found = await self.cri.list_containers(sandbox_id=state.sandbox_id)
        out: list[JsonObj] = []
        for container in (pod.get("spec") or {}).get("containers") or []:
            name = container["name"]
            mine = sorted((c for c in found if c.name == name), key=lambda c: c.created_at_ns, reverse=True)
            mine = [
                await self.cri.container_status(c.id) if c.state is ContainerState.EXITED else c
                for c in mine[:2]
            ]
            latest = mine[0] if mine else None
            status: JsonObj = {
                "name": name,
                "image": container["image"],
                "imageID": latest.image_ref if latest is not None else "",
                "restartCount": latest.attempt if latest is not None else 0,
                "ready": False,
                "started": False,
            }
            if latest is not None:
                status["containerID"] = f"containerd://{latest.id}"
            exited = [c for c in mine if c.state is ContainerState.EXITED]
            reason = state.reasons.get(name)
            if latest is not None and latest.state is ContainerState.RUNNING:
                status.update(
                    ready=True, started=True, state={"running": {"startedAt": _time(latest.started_at_ns)}}
                )
                if exited:
                    status["lastState"] = {"terminated": _terminated(exited[0])}
            elif reason is not None:
                status["state"] = {"waiting": {"reason": reason[0], "message": reason[1]}}
                if exited:
                    status["lastState"] = {"terminated": _terminated(exited[0])}
            elif latest is not None and latest.state is ContainerState.EXITED:
                status["state"] = {"terminated": _terminated(latest)}
            else:
                status["state"] = {"waiting": {"reason": CONTAINER_CREATING}}
            out.append(status)
        return out

    def _event(self, pod: str, reason: str, container: str, message: str) -> None:
        self.events.append(KubeletEvent(pod, reason, container, message, self.clock()))


def _time(ns: int) -> str | None:
    return format_time(datetime.fromtimestamp(ns / 1e9, UTC)) if ns > 0 else None


def _terminated(c: ContainerInfo) -> JsonObj:
    """A ``ContainerStateTerminated`` of an exited container (its CRI ContainerStatus)."""
    return {
        "exitCode": c.exit_code,
        "reason": c.reason or ("Completed" if c.exit_code == 0 else "Error"),
        "message": c.message,
        "startedAt": _time(c.started_at_ns),
        "finishedAt": _time(c.finished_at_ns),
        "containerID": f"containerd://{c.id}",
    }


def _should_restart(policy: str, latest: ContainerInfo) -> bool:
    """``ShouldContainerBeRestarted`` for an exited container."""
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return latest.exit_code != 0
    return True
