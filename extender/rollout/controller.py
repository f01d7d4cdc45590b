"""The in-place rollout controller (WeFlex §3.3 "Transforming K8s for In-Situ Restart", §3.2
step e): turns workload image edits and completed lends/reclaims into hot restarts.

Layout as the lease controller's: :class:`~extender.lease.mirror.Mirror` s (StatefulSets, Pods,
GPULeases, the training-operator kinds) only enqueue keys; one worker reconciles them,
level-triggered, planning with :func:`extender.rollout.plan.plan`:

* ``sts/<ns>/<name>``: a StatefulSet labelled ``flexlease.io/restart-policy: InPlace`` with
  ``updateStrategy.type: OnDelete`` (Kubernetes itself then never replaces its pods). When its
  template's container images differ from what its pods run, the controller writes
  ``flexlease.io/hot-restart`` on one pod after another (highest ordinal first, at most
  ``flexlease.io/max-unavailable`` at once, default 1, ``all`` for every pod), waits for each
  ``flexlease.io/hot-restart-status``, and stops at the first ``Failed``. The node agent does
  the rest: it prelaunches (pulls the image, fetches the checkpoint) with the old container
  still running, then — under a kubelet — patches the pod spec's image itself so kubelet
  restarts the container in its sandbox; the controller never touches the pod spec. A
  StatefulSet without the label, or with ``RollingUpdate``, is left to Kubernetes.
* ``pytorchjob/``, ``mpijob/``, ``raycluster/<ns>/<name>``: a training-operator job
  (kubeflow.org/v1 PyTorchJob, MPIJob; ray.io/v1 RayCluster) labelled ``InPlace``: when one of
  its pod templates' images changes (:mod:`extender.rollout.jobs` reads them), the pods made
  from it — those whose controller owner reference names the job, mapped to templates by the
  operators' replica labels — get hot-restart requests in the order of the job's framework
  profile, a wave at once when the profile says ``restartTogether``, else one pod at a time
  (``flexlease.io/max-unavailable`` on the job overrides). The kinds are mirrored by
  :class:`~extender.rollout.jobmirror.JobMirror`, which waits quietly while a kind is not served.
* ``lease/<ns>/<name>``: a GPULease (Lend or Reclaim) that reached ``Done`` — a completion this
  controller observed, never an old one found at start-up (:mod:`extender.rollout.age`): the owner's pods
  labelled ``flexlease.io/restart-policy: InPlace`` that ran before it (not those created to
  take the GPUs back, ``flexlease.io/reclaim``, nor any created after the lease: they start
  on the new GPU set) get a same-image restart request so the training framework picks up
  its new GPU set, in waves from the job's framework profile
  (:mod:`extender.rollout.order`), every pod of a wave at once.

Progress goes to ``flexlease.io/rollout-status`` on the StatefulSet, the job or the GPULease (JSON:
revision, phase, updated/total, current, lastError, skipped, per-pod restart and pause
seconds), Events (``RolloutStarted``, ``RolloutComplete``, ``RolloutFailed``,
``RolloutSuperseded``, ``PodSkipped``, ``InvalidSpec``, ``InPlaceIgnored`` on the workload;
``HotRestartRequested``, ``HotRestartFailed`` on pods) and the metrics of
:class:`RolloutMetrics`. Pod writes carry the pod's resourceVersion; a ``Conflict`` re-reads
and plans again. Runs only on the leader (:func:`cleanup_ctx`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import ValidationError

from extender import tasks
from extender.lease.events import ObjectRef, event_object
from extender.lease.mirror import Mirror
from extender.lease.planner import EventType
from extender.lease.view import parse_time
from extender.lease.workqueue import WorkQueue, warn_and_retry
from extender.orchestrator import profile as profiles
from extender.rollout import age
from extender.rollout import plan as rollout
from extender.rollout.jobmirror import JobMirror
from extender.rollout.jobs import JOB_KINDS, JobKind, job_revision_images
from extender.rollout.order import OrdinalOrder, ProfileOrder, RestartOrder
from flexlease.api import keys
from flexlease.api.pod import default_owner, is_terminated, owner_from_label
from flexlease.api.resources import LeaseAction, LeasePhase, parse_gpulease
from flexlease.clock import Clock, SystemClock
from flexlease.config import Settings
from flexlease.errors import Conflict, NotFound, PodSpecError
from flexlease.logging import ctx
from flexlease.store.base import EventType as WatchType
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.leader import LeaderElector, run_leader_only

log = logging.getLogger(__name__)

STS_PREFIX: Final = "sts/"
LEASE_PREFIX: Final = "lease/"
JOB_PREFIXES: Final = {
    kind: f"{kind.value.lower()}/" for kind in (Kind.PYTORCHJOB, Kind.MPIJOB, Kind.RAYCLUSTER)
}
"""Work-queue key prefixes of the training-operator kinds (``pytorchjob/<ns>/<name>``...)."""
CONFLICT_RETRIES: Final = 5
COMPONENT: Final = "flexlease-rollout-controller"
ON_DELETE: Final = "OnDelete"
TRIGGER_IMAGE: Final = "image"
TRIGGER_LEASE: Final = "lease"


class RolloutMetrics:
    """``flexlease_rollout_restarts_in_progress{trigger}`` (gauge),
    ``flexlease_rollout_restart_seconds{trigger}`` (histogram of the agents' ``totalSeconds``),
    ``flexlease_rollout_restart_failures_total{trigger}``,
    ``flexlease_rollouts_total{trigger,outcome=complete|failed}``; ``trigger`` is ``image``
    (a workload edit) or ``lease`` (reconfiguration after a lend or reclaim)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.in_progress = Gauge(
            "flexlease_rollout_restarts_in_progress",
            "Hot restarts requested by a rollout and not finished yet.",
            ["trigger"],
            registry=registry,
        )
        self.seconds = Histogram(
            "flexlease_rollout_restart_seconds",
            "Duration of a rollout's hot restarts as the node agent measured them.",
            ["trigger"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=registry,
        )
        self.failures = Counter(
            "flexlease_rollout_restart_failures",
            "Hot restarts of a rollout that failed.",
            ["trigger"],
            registry=registry,
        )
        self.rollouts = Counter(
            "flexlease_rollouts", "Rollouts finished, by outcome.", ["trigger", "outcome"], registry=registry
        )
        for trigger in (TRIGGER_IMAGE, TRIGGER_LEASE):
            self.in_progress.labels(trigger=trigger)
            self.failures.labels(trigger=trigger)
            for outcome in ("complete", "failed"):
                self.rollouts.labels(trigger=trigger, outcome=outcome)


def _meta(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def _opted_in(obj: Mapping[str, Any]) -> bool:
    labels = _meta(obj).get("labels") or {}
    return isinstance(labels, dict) and labels.get(keys.LABEL_RESTART_POLICY) == keys.RESTART_POLICY_IN_PLACE


def _controller_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    ref = _controller_ref(pod)
    return (str(ref.get("kind") or ""), str(ref.get("name") or "")) if ref is not None else None


def _controller_ref(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def pod_owner(pod: Mapping[str, Any]) -> str | None:
    """The job a pod belongs to, ``<ns>/<job>``: its ``flexlease.io/owner`` label (``<job>``,
    in the pod's namespace), else its controller — as :func:`flexlease.api.pod.parse_pod` reads it."""
    meta = _meta(pod)
    namespace = str(meta.get("namespace") or "")
    labels = meta.get("labels") or {}
    owner = labels.get(keys.LABEL_OWNER) if isinstance(labels, dict) else None
    if isinstance(owner, str) and owner:
        try:
            return owner_from_label(owner, namespace)
        except PodSpecError:
            return None  # an invalid label names no job: the pod is not this job's
    return default_owner(meta, namespace)


def _started_with_new_gpus(pod: Mapping[str, Any], lease: Mapping[str, Any]) -> bool:
    """A pod created to take back lent GPUs (``flexlease.io/reclaim: "true"``) or created
    after the lease starts on its new GPU set already: it needs no reconfiguration restart."""
    meta = _meta(pod)
    if (meta.get("annotations") or {}).get(keys.ANN_RECLAIM) == "true":
        return True
    created, since = meta.get("creationTimestamp"), _meta(lease).get("creationTimestamp")
    try:
        return isinstance(created, str) and isinstance(since, str) and parse_time(created) > parse_time(since)
    except ValueError:
        return False  # unreadable: restart it rather than leave it on a stale GPU set


def _with_role(state: rollout.PodState, job: JobKind, replica: str) -> rollout.PodState:
    """``state`` with ``flexlease.io/framework`` and ``flexlease.io/role`` from the job's kind
    and the pod's replica, unless the pod's own labels set them (those win)."""
    role = job.role(replica)
    labels = {keys.LABEL_FRAMEWORK: job.framework, **({keys.LABEL_ROLE: role} if role else {})}
    return dataclasses.replace(state, labels={**labels, **state.labels})


class RolloutController:
    """Reconciles in-place rollouts (see the module docstring). ``order``: the restart order
    of lease reconfigurations (default: by framework profile, the built-in profiles)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        instance: str | None = None,
        order: RestartOrder | None = None,
    ) -> None:
        self._settings = settings.lease
        self._store = store
        self._clock: Clock = clock or SystemClock()
        self._instance = instance or socket.gethostname()
        self._profiles = profiles.builtin()
        self._order: RestartOrder = order or ProfileOrder(self._profiles)
        self.metrics = RolloutMetrics(registry)
        self._queue = WorkQueue(
            self._clock,
            base_delay=self._settings.retry_base_seconds,
            max_delay=self._settings.retry_max_seconds,
        )
        self._sets = Mirror(store, Kind.STATEFULSET, on_change=self._set_changed)
        self._pods = Mirror(store, Kind.POD, on_change=self._pod_changed)
        self._leases = Mirror(store, Kind.GPULEASE, on_change=self._lease_changed)
        probe = self._settings.resync_seconds
        self._jobs: dict[Kind, JobMirror] = {
            Kind.PYTORCHJOB: JobMirror(
                store,
                Kind.PYTORCHJOB,
                on_change=functools.partial(self._job_changed, Kind.PYTORCHJOB),
                clock=self._clock,
                probe_seconds=probe,
            ),
            Kind.MPIJOB: JobMirror(
                store,
                Kind.MPIJOB,
                on_change=functools.partial(self._job_changed, Kind.MPIJOB),
                clock=self._clock,
                probe_seconds=probe,
            ),
            Kind.RAYCLUSTER: JobMirror(
                store,
                Kind.RAYCLUSTER,
                on_change=functools.partial(self._job_changed, Kind.RAYCLUSTER),
                clock=self._clock,
                probe_seconds=probe,
            ),
        }
        self._observed: set[tuple[str, str]] = set()
        """(pod uid, request id) whose final status went into the metrics."""
        self._current: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._started: datetime | None = None
        """When :meth:`run` began: leases done before it are not reconfigured (:mod:`.age`)."""
        self._unfinished: set[str] = set()
        """Leases (uid) seen in a phase other than ``Done`` since the start."""
        self._observed_done: dict[str, datetime] = {}
        """Leases (uid) seen unfinished, then ``Done``: when the controller first saw them done."""

    @property
    def ready(self) -> bool:
        """True once StatefulSets, Pods and GPULeases have each been listed, and each
        training-operator kind listed or found not served."""
        return all(m.listed.is_set() for m in (self._sets, self._pods, self._leases)) and all(
            m.settled for m in self._jobs.values()
        )

    def serves(self, kind: Kind) -> bool:
        """Whether the training-operator ``kind`` is served (its CRD installed) and mirrored."""
        mirror = self._jobs.get(kind)
        return mirror is not None and mirror.served

    @property
    def idle(self) -> bool:
        return self._queue.idle

    async def run(self) -> None:
        """Watch and reconcile until cancelled."""
        log.info("rollout controller starting")
        self._started = self._clock.now_utc()
        self._enqueue_all()
        async with asyncio.TaskGroup() as group:
            for mirror in (self._sets, self._pods, self._leases, *self._jobs.values()):
                group.create_task(mirror.run(), name=f"rollout-mirror-{mirror.kind.value}")
            group.create_task(self._resync(), name="rollout-resync")
            group.create_task(self._work(), name="rollout-worker")

    async def _resync(self) -> None:
        tick = asyncio.Event()
        while True:
            tick.clear()
            await self._clock.wait(tick, self._settings.resync_seconds)
            self._enqueue_all()

    async def _work(self) -> None:
        on_error = warn_and_retry("rollout reconcile", quiet=Conflict, logger=log)
        while True:
            await self._queue.process_next(self.reconcile, on_error=on_error)

    # ------------------------------------------------------------------ triggers

    def _enqueue_all(self) -> None:
        for obj in self._sets.values():
            if _opted_in(obj):
                meta = _meta(obj)
                self._queue.add(f"{STS_PREFIX}{meta.get('namespace')}/{meta.get('name')}")
        for obj in self._leases.values():
            self._lease_changed(WatchType.MODIFIED, obj)
        for kind, mirror in self._jobs.items():
            for obj in mirror.values():
                if _opted_in(obj):
                    self._job_changed(kind, WatchType.MODIFIED, obj)

    def _set_changed(self, type: WatchType, obj: JsonObj) -> None:
        meta = _meta(obj)
        self._queue.add(f"{STS_PREFIX}{meta.get('namespace')}/{meta.get('name')}")

    def _job_changed(self, kind: Kind, type: WatchType, obj: JsonObj) -> None:
        meta = _meta(obj)
        self._queue.add(f"{JOB_PREFIXES[kind]}{meta.get('namespace')}/{meta.get('name')}")

    def _lease_changed(self, type: WatchType, obj: JsonObj) -> None:
        status = obj.get("status") or {}
        done = isinstance(status, dict) and status.get("phase") == LeasePhase.DONE.value
        self._observe_lease(obj, done=done, deleted=type is WatchType.DELETED)
        if type is WatchType.DELETED:
            return
        current = rollout.parse_rollout_status(
            (_meta(obj).get("annotations") or {}).get(keys.ANN_ROLLOUT_STATUS)
        )
        if done and (current is None or current.phase is rollout.RolloutPhase.PROGRESSING):
            meta = _meta(obj)
            self._queue.add(f"{LEASE_PREFIX}{meta.get('namespace')}/{meta.get('name')}")

    def _observe_lease(self, obj: JsonObj, *, done: bool, deleted: bool = False) -> None:
        """Remember what the age guard needs: leases seen unfinished, and when they turned done."""
        uid = str(_meta(obj).get("uid") or "")
        if not uid or self._started is None:
            return
        if deleted:
            self._unfinished.discard(uid)
            self._observed_done.pop(uid, None)
        elif not done:
            self._unfinished.add(uid)
            self._observed_done.pop(uid, None)
        elif uid in self._unfinished and uid not in self._observed_done:
            self._observed_done[uid] = self._clock.now_utc()

    def _reconfiguration_due(self, obj: JsonObj) -> age.Verdict:
        """The age guard (:mod:`extender.rollout.age`) for a done lease with no rollout yet."""
        uid = str(_meta(obj).get("uid") or "")
        now = self._clock.now_utc()
        return age.due(
            seen_unfinished=uid in self._unfinished,
            completed=age.completed_at(obj),
            observed_done=self._observed_done.get(uid),
            started=self._started or now,
            now=now,
            max_age=timedelta(seconds=self._settings.reconfigure_max_age_seconds),
        )

    def _pod_changed(self, type: WatchType, obj: JsonObj) -> None:
        owner = _controller_of(obj)
        namespace = str(_meta(obj).get("namespace") or "")
        if owner is not None and owner[0] == "StatefulSet":
            self._queue.add(f"{STS_PREFIX}{namespace}/{owner[1]}")
        job = JOB_KINDS.get(owner[0]) if owner is not None else None
        if owner is not None and job is not None:
            self._queue.add(f"{JOB_PREFIXES[job.kind]}{namespace}/{owner[1]}")
        if self._pod_opted_in(obj):
            for lease in self._leases.values():
                if _meta(lease).get("namespace") == namespace:
                    self._lease_changed(WatchType.MODIFIED, lease)

    def _job_of(self, pod: Mapping[str, Any]) -> tuple[JobKind, JsonObj] | None:
        """The training-operator job controlling ``pod`` (kind and the mirrored object), or None."""
        ref = _controller_ref(pod)
        job = JOB_KINDS.get(str(ref.get("kind"))) if ref is not None else None
        if ref is None or job is None:
            return None
        obj = self._jobs[job.kind].get(str(_meta(pod).get("namespace") or ""), str(ref.get("name") or ""))
        if obj is None or (
            ref.get("uid") and _meta(obj).get("uid") and ref.get("uid") != _meta(obj).get("uid")
        ):
            return None
        return job, obj

    def _pod_opted_in(self, pod: Mapping[str, Any]) -> bool:
        """The pod carries ``flexlease.io/restart-policy: InPlace``, or its training-operator
        job does."""
        if _opted_in(pod):
            return True
        found = self._job_of(pod)
        return found is not None and _opted_in(found[1])

    def _read_job_pod(self, pod: Mapping[str, Any]) -> rollout.PodState:
        """:func:`rollout.read_pod`, with ``flexlease.io/framework`` and ``flexlease.io/role``
        filled in from the training-operator's labels when the pod lacks them (so a lease's
        reconfiguration follows the job's profile)."""
        state = rollout.read_pod(pod)
        found = self._job_of(pod)
        replica = found[0].replica(state.labels) if found is not None else None
        if found is None or replica is None:
            return state
        return _with_role(state, found[0], replica)

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> None:
        """Reconcile one key (``sts/<ns>/<name>``, ``lease/<ns>/<name>``, or a job's:
        ``pytorchjob/``, ``mpijob/``, ``raycluster/``) once, re-planning after a conflicting
        write up to ``CONFLICT_RETRIES`` times (then ``Conflict``). Raises ``ValueError`` on an
        unknown key, other ``StoreError`` s for the caller's back-off."""
        handlers: list[tuple[str, Callable[..., Awaitable[None]]]] = [
            (STS_PREFIX, self._reconcile_set),
            (LEASE_PREFIX, self._reconcile_lease),
            *(
                (prefix, functools.partial(self._reconcile_job, kind))
                for kind, prefix in JOB_PREFIXES.items()
            ),
        ]
        for prefix, handler in handlers:
            if key.startswith(prefix) and key.count("/") == 2:
                namespace, name = key[len(prefix) :].split("/")
                for attempt in range(CONFLICT_RETRIES):
                    try:
                        await handler(namespace, name, key=key)
                        return
                    except Conflict:
                        if attempt == CONFLICT_RETRIES - 1:
                            raise
                return
        raise ValueError(f"unknown work-queue key {key!r}")

    async def _reconcile_set(self, namespace: str, name: str, *, key: str) -> None:
        try:
            obj = await self._store.get(Kind.STATEFULSET, name, namespace=namespace)
        except NotFound:
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        self._sets.put(obj)
        meta = _meta(obj)
        ref = ObjectRef("apps/v1", "StatefulSet", name, namespace, meta.get("uid"))
        if not _opted_in(obj):
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        spec = obj.get("spec") or {}
        strategy = (spec.get("updateStrategy") or {}).get("type") or "RollingUpdate"
        if strategy != ON_DELETE:
            await self._warn_once(
                ref,
                "InPlaceIgnored",
                f"{keys.LABEL_RESTART_POLICY}={keys.RESTART_POLICY_IN_PLACE} needs updateStrategy "
                f"{ON_DELETE}; with {strategy} Kubernetes replaces the pods itself",
                version=str(meta.get("generation") or meta.get("resourceVersion")),
            )
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        replicas = spec.get("replicas", 1)
        replicas = replicas if isinstance(replicas, int) and replicas >= 0 else 1
        images = rollout.template_images(spec.get("template") or {})
        revision = rollout.revision_of(images)
        expected = [f"{name}-{i}" for i in range(replicas)]
        pods: dict[str, rollout.PodState] = {}
        for pod in self._pods.values():
            pmeta = _meta(pod)
            if pmeta.get("namespace") != namespace or pmeta.get("name") not in expected:
                continue
            if _controller_of(pod) != ("StatefulSet", name) or is_terminated(pod):
                continue
            if pmeta.get("deletionTimestamp"):
                continue  # being deleted: vanishing, skipped (its replacement gets the new template)
            pods[str(pmeta["name"])] = rollout.read_pod(pod)
        annotations = meta.get("annotations") or {}
        try:
            max_unavailable = rollout.parse_max_unavailable(
                annotations.get(keys.ANN_MAX_UNAVAILABLE), replicas
            )
        except ValueError as exc:
            await self._warn_once(
                ref, "InvalidSpec", f"{exc}; using 1", version=str(meta.get("resourceVersion"))
            )
            max_unavailable = 1
        previous = rollout.parse_rollout_status(annotations.get(keys.ANN_ROLLOUT_STATUS))
        by_name = dict(images)
        result = rollout.plan(
            revision=revision,
            targets={pod: by_name for pod in expected},
            waves=OrdinalOrder().waves(
                [pods.get(n) or rollout.PodState(namespace, n, None, None, {}) for n in expected]
            ),
            pods=pods,
            previous=previous,
            max_unavailable=max_unavailable,
            now=self._clock.now_utc(),
        )
        await self._apply(
            result, previous, ref=ref, kind=Kind.STATEFULSET, obj=obj, key=key, trigger=TRIGGER_IMAGE
        )

    async def _reconcile_job(self, kind: Kind, namespace: str, name: str, *, key: str) -> None:
        """A training-operator job: its pods (controller owner reference to the job) move to
        their templates' images, in the order of the job's framework profile; at most
        ``flexlease.io/max-unavailable`` at once, else every pod of a wave when the profile
        says ``restartTogether``, else one."""
        job: JobKind = JOB_KINDS[kind.value]
        mirror = self._jobs[kind]
        try:
            obj = await mirror.fetch(name, namespace)
        except NotFound:
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        mirror.put(obj)
        meta = _meta(obj)
        uid = meta.get("uid")
        ref = ObjectRef(job.api_version, kind.value, name, namespace, uid)
        if not _opted_in(obj):
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        templates = {replica: images for replica, images in job.templates(obj).items() if images}
        if not templates:
            await self._warn_once(
                ref,
                "InvalidSpec",
                f"{kind.value} {name} has no pod template with containers; nothing to roll out",
                version=str(meta.get("resourceVersion")),
            )
            self._finish(key, TRIGGER_IMAGE, 0)
            return
        pods: dict[str, rollout.PodState] = {}
        replicas: dict[str, str] = {}
        for pod in self._pods.values():
            pmeta = _meta(pod)
            owner = _controller_ref(pod)
            if pmeta.get("namespace") != namespace or owner is None:
                continue
            if owner.get("kind") != kind.value or owner.get("name") != name:
                continue
            if uid and owner.get("uid") and owner.get("uid") != uid:
                continue  # a pod of an earlier job of the same name
            if is_terminated(pod) or pmeta.get("deletionTimestamp"):
                continue  # finished or leaving: the operator replaces it from the template
            state = rollout.read_pod(pod)
            replica = job.replica(state.labels)
            if replica is None or replica not in templates:
                await self._warn_once(
                    ref,
                    "PodNotMatched",
                    f"pod {state.name}: its labels name no pod template of {kind.value} {name} "
                    f"(replica {replica!r}); left alone",
                    version=state.name,
                )
                continue
            pods[state.name] = _with_role(state, job, replica)
            replicas[state.name] = replica
        revision = rollout.revision_of(job_revision_images(templates))
        annotations = meta.get("annotations") or {}
        previous = rollout.parse_rollout_status(annotations.get(keys.ANN_ROLLOUT_STATUS))
        waves = self._order.waves(list(pods.values()))
        targets: dict[str, dict[str, str]] = {n: dict(templates[replicas[n]]) for n in pods}
        if previous is not None and previous.revision == revision:
            gone = [n for n in previous.pods if n not in pods]
            if gone:
                waves = [*waves, gone]
                targets.update({n: {} for n in gone})
        frameworks = {p.labels.get(keys.LABEL_FRAMEWORK) for p in pods.values()}
        profile = self._profiles.get(frameworks.pop() or "") if len(frameworks) == 1 else None
        try:
            max_unavailable = rollout.parse_max_unavailable(
                annotations.get(keys.ANN_MAX_UNAVAILABLE), len(targets)
            )
        except ValueError as exc:
            await self._warn_once(
                ref, "InvalidSpec", f"{exc}; using 1", version=str(meta.get("resourceVersion"))
            )
            max_unavailable = 1
        if keys.ANN_MAX_UNAVAILABLE not in annotations and profile is not None and profile.restart_together:
            max_unavailable = max(1, len(targets))
        result = rollout.plan(
            revision=revision,
            targets=targets,
            waves=waves,
            pods=pods,
            previous=previous,
            max_unavailable=max_unavailable,
            now=self._clock.now_utc(),
        )
        await self._apply(result, previous, ref=ref, kind=kind, obj=obj, key=key, trigger=TRIGGER_IMAGE)

    async def _reconcile_lease(self, namespace: str, name: str, *, key: str) -> None:
        try:
            obj = await self._store.get(Kind.GPULEASE, name, namespace=namespace)
        except NotFound:
            self._finish(key, TRIGGER_LEASE, 0)
            return
        self._leases.put(obj)
        try:
            lease = parse_gpulease(obj)
        except ValidationError:
            return  # the lease controller reports it
        self._observe_lease(obj, done=lease.status.phase is LeasePhase.DONE)
        if lease.status.phase is not LeasePhase.DONE:
            return
        meta = _meta(obj)
        previous = rollout.parse_rollout_status((meta.get("annotations") or {}).get(keys.ANN_ROLLOUT_STATUS))
        if previous is not None and previous.phase is not rollout.RolloutPhase.PROGRESSING:
            self._finish(key, TRIGGER_LEASE, 0)
            return
        verb = "reclaim" if lease.spec.action is LeaseAction.RECLAIM else "lend"
        verdict = self._reconfiguration_due(obj) if previous is None else age.Verdict(True)
        if not verdict.due:
            # recorded, so that it is decided once and readers (the orchestrator's relaunch)
            # see that no in-place restart follows this lease
            now = self._clock.now_utc()
            skipped = rollout.RolloutStatus(
                revision=f"{verb}-{name}",
                phase=rollout.RolloutPhase.SKIPPED,
                message=f"not reconfigured in place: {verdict.reason}",
                started_at=now,
                finished_at=now,
            )
            new = await self._store.patch(
                Kind.GPULEASE,
                name,
                {"metadata": {"annotations": {keys.ANN_ROLLOUT_STATUS: skipped.render()}}},
                namespace=namespace,
                resource_version=meta.get("resourceVersion"),
            )
            self._leases.put(new)
            log.info("lease reconfiguration skipped", extra=ctx(lease=key, reason=verdict.reason))
            self._finish(key, TRIGGER_LEASE, 0)
            return
        ref = ObjectRef(keys.API_VERSION, keys.GPULEASE_KIND, name, namespace, meta.get("uid"))
        pods: dict[str, rollout.PodState] = {}
        for pod in self._pods.values():
            pmeta = _meta(pod)
            if pmeta.get("namespace") != namespace or not self._pod_opted_in(pod) or is_terminated(pod):
                continue
            if pmeta.get("deletionTimestamp"):
                continue  # leaving (a lend scales the job down)
            if not (pod.get("spec") or {}).get("nodeName") or pod_owner(pod) != lease.spec.owner:
                continue
            if previous is None and _started_with_new_gpus(pod, obj):
                continue
            if previous is not None and pmeta.get("name") not in previous.pods:
                continue  # the set is fixed when the reconfiguration starts
            pods[str(pmeta.get("name"))] = self._read_job_pod(pod)
        waves = self._order.waves(list(pods.values()))
        if previous is not None:
            gone = [n for n in previous.pods if n not in pods]
            if gone:
                waves = [*waves, gone]
        targets: dict[str, dict[str, str]] = {}
        for pod_name, state in pods.items():
            container = self._order.container(state) or next(iter(state.images), "")
            targets[pod_name] = {container: state.images[container]} if container in state.images else {}
        for pod_name in previous.pods if previous is not None else ():
            targets.setdefault(pod_name, {})
        prefix = f"rc-{str(meta.get('uid') or name)[:8]}"
        result = rollout.plan(
            revision=f"{verb}-{name}",
            targets=targets,
            waves=waves,
            pods=pods,
            previous=previous,
            max_unavailable=max(1, len(pods)),
            now=self._clock.now_utc(),
            id_prefix=prefix,
        )
        await self._apply(
            result, previous, ref=ref, kind=Kind.GPULEASE, obj=obj, key=key, trigger=TRIGGER_LEASE
        )

    # ------------------------------------------------------------------ writes

    async def _apply(
        self,
        result: rollout.Plan,
        previous: rollout.RolloutStatus | None,
        *,
        ref: ObjectRef,
        kind: Kind,
        obj: JsonObj,
        key: str,
        trigger: str,
    ) -> None:
        written: list[rollout.Write] = []
        for write in result.writes:
            patch = {"metadata": {"annotations": {keys.ANN_HOT_RESTART: write.request.render()}}}
            try:
                new = await self._store.patch(
                    Kind.POD,
                    write.pod.name,
                    patch,
                    namespace=write.pod.namespace,
                    resource_version=write.pod.resource_version,
                )
            except NotFound:
                continue  # vanished: the next plan reports it skipped
            except Conflict:
                fresh = await self._get_pod(write.pod.namespace, write.pod.name)
                if fresh is not None:
                    self._pods.put(fresh)
                raise
            self._pods.put(new)
            written.append(write)
            log.info(
                "hot restart requested",
                extra=ctx(
                    pod=f"{write.pod.namespace}/{write.pod.name}",
                    container=write.request.container,
                    image=write.request.image,
                    id=write.request.id,
                    workload=f"{ref.namespace}/{ref.name}",
                ),
            )
        meta = _meta(obj)
        status = result.status
        if len(written) != len(result.writes):
            lost = {w.pod.name for w in result.writes if w not in written}
            status = status.model_copy(update={"current": tuple(sorted(set(status.current) - lost))})
        if previous is None or status.render() != previous.render():
            patch = {"metadata": {"annotations": {keys.ANN_ROLLOUT_STATUS: status.render()}}}
            version = meta.get("resourceVersion")
            if kind is Kind.STATEFULSET:  # literal kinds: hack/api_calls.py derives the RBAC from them
                new = await self._store.patch(
                    Kind.STATEFULSET, ref.name, patch, namespace=ref.namespace, resource_version=version
                )
                self._sets.put(new)
            elif kind in self._jobs:
                await self._jobs[kind].annotate(
                    ref.name,
                    ref.namespace or "",
                    {keys.ANN_ROLLOUT_STATUS: status.render()},
                    resource_version=version,
                )
            else:
                new = await self._store.patch(
                    Kind.GPULEASE, ref.name, patch, namespace=ref.namespace, resource_version=version
                )
                self._leases.put(new)
            log.info(
                "rollout status",
                extra=ctx(
                    workload=f"{ref.namespace}/{ref.name}",
                    revision=status.revision,
                    phase=status.phase.value,
                    updated=f"{status.updated}/{status.total}",
                    current=",".join(status.current),
                    error=status.last_error,
                ),
            )
            same = previous is not None and previous.revision == status.revision
            was_running = same and previous is not None and previous.phase is rollout.RolloutPhase.PROGRESSING
            failed = status.phase is rollout.RolloutPhase.FAILED
            if (status.phase is rollout.RolloutPhase.COMPLETE and was_running) or (
                failed
                and not (same and previous is not None and previous.phase is rollout.RolloutPhase.FAILED)
            ):
                outcome = "failed" if failed else "complete"
                self.metrics.rollouts.labels(trigger=trigger, outcome=outcome).inc()
        unwritten = {w.pod.name for w in result.writes if w not in written}
        for note in result.notes:
            if note.pod is not None and note.pod in unwritten:
                continue
            target = ref
            if note.pod is not None:
                pod = self._pods.get(ref.namespace, note.pod)
                target = ObjectRef.pod(ref.namespace or "", note.pod, _meta(pod).get("uid"))
            await self._emit(target, note.reason, note.message, warning=note.warning)
        for pod_name, finished in result.finished:
            pod = self._pods.get(ref.namespace, pod_name)
            mark = (str(_meta(pod).get("uid") or pod_name), finished.id)
            if mark in self._observed:
                continue
            self._observed.add(mark)
            if finished.phase == "Succeeded" and finished.total_seconds is not None:
                self.metrics.seconds.labels(trigger=trigger).observe(finished.total_seconds)
            elif finished.phase == "Failed":
                self.metrics.failures.labels(trigger=trigger).inc()
        self._finish(
            key, trigger, len(status.current) if status.phase is rollout.RolloutPhase.PROGRESSING else 0
        )

    def _finish(self, key: str, trigger: str, current: int) -> None:
        """Record how many restarts ``key`` has in flight, for the gauge."""
        if current:
            self._current[key] = current
        else:
            self._current.pop(key, None)
        total = sum(
            n for k, n in self._current.items() if k.startswith(LEASE_PREFIX) == (trigger == TRIGGER_LEASE)
        )
        self.metrics.in_progress.labels(trigger=trigger).set(total)

    async def _get_pod(self, namespace: str, name: str) -> JsonObj | None:
        try:
            return await self._store.get(Kind.POD, name, namespace=namespace)
        except NotFound:
            return None

    async def _warn_once(self, ref: ObjectRef, reason: str, message: str, *, version: str) -> None:
        mark = (f"{ref.namespace}/{ref.name}/{reason}", version)
        if mark in self._warned:
            return
        self._warned.add(mark)
        log.warning(message, extra=ctx(workload=f"{ref.namespace}/{ref.name}", reason=reason))
        await self._emit(ref, reason, message, warning=True)

    async def _emit(self, ref: ObjectRef, reason: str, message: str, *, warning: bool) -> None:
        """Create an Event; a failure is logged (Events are best effort), never raised."""
        event = event_object(
            ref,
            reason,
            message=message,
            type=EventType.WARNING if warning else EventType.NORMAL,
            now=self._clock.now_utc(),
            instance=self._instance,
        )
        event["source"] = {"component": COMPONENT}
        event["reportingComponent"] = COMPONENT
        try:
            await self._store.create(Kind.EVENT, event)
        except Exception as exc:
            log.warning("event not recorded", extra=ctx(reason=reason, object=ref.name, error=str(exc)))


async def serve(
    controller: RolloutController,
    settings: Settings,
    *,
    store: Store,
    instance: str,
    elector: LeaderElector | None = None,
) -> None:
    """Run ``controller`` until cancelled; with ``settings.lease.leader_election`` only while
    this replica leads (sharing ``elector`` when given, else running its own)."""
    await run_leader_only(
        controller.run,
        settings.lease,
        store=store,
        instance=instance,
        name="rollout-controller",
        elector=elector,
    )


ROLLOUT_CONTROLLER: Final = web.AppKey("rollout_controller", RolloutController)
"""Where :func:`cleanup_ctx` puts the controller."""


def cleanup_ctx(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    instance: str | None = None,
    elector: LeaderElector | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the controller (see :func:`serve`) as the task
    ``rollout-controller`` for the application's lifetime; with ``settings.lease.enabled``
    false (the extender runs no controllers) it runs nothing."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        if not settings.lease.enabled:
            yield
            return
        name = instance or socket.gethostname()
        controller = RolloutController(settings, store, registry=registry, clock=clock, instance=name)
        app[ROLLOUT_CONTROLLER] = controller
        work = serve(controller, settings, store=store, instance=name, elector=elector)
        async with tasks.running(work, name="rollout-controller"):
            yield

    return context
