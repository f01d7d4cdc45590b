"""The lease autopilot's controller: reconciles ``GPULeasePolicy`` objects into ``GPULease``
Lend and Reclaim objects, which the lease controller (:mod:`extender.lease.controller`) carries
out — the autopilot never writes a tag, a pod or a GPUNode (issue #40, DESIGN §2).

Layout as the lease controller's: :class:`~extender.lease.mirror.Mirror` s of GPULeasePolicies,
GPULeases and GPUNodes only enqueue keys ``policy/<ns>/<name>`` on a
:class:`~extender.lease.workqueue.WorkQueue`; one worker reconciles them, level-triggered, each
reconcile reading afresh what decides a write:

1. GET the policy; an invalid one (the models' checks, or an owner outside the policy's
   namespace) gets condition ``Valid=False`` with the message and a Warning Event, nothing else;
2. LIST the owner's namespace's pods: what the job holds (``allocated``), of that what its
   non-critical pods hold (``lendable``: critical roles — coordinator, Ray head, rank 0 — by the
   orchestrator's framework profiles are never lent), and from the GPUNode mirror its GPUs out
   on loan (tagged for it, held by none of its pods);
3. the lead time (:mod:`extender.autopilot.leadtime`), the demand
   (:mod:`extender.autopilot.demand`), the plan and the decision (:mod:`extender.autopilot.plan`);
4. LIST the namespace's GPULeases: a lease of the owner not in a final phase (Done, Failed,
   Cancelled) — the autopilot's or anyone's — means hold (never two in flight);
5. a Lend or Reclaim is *created* as a GPULease named ``<policy>-<lend|reclaim>-<sequence>``
   with labels ``flexlease.io/policy`` and ``flexlease.io/policy-sequence``, then the status is
   written (demand, plan, forecast, lastDecision, conditions; a Lend or Reclaim stays the last
   decision while its lease is in flight, then a Hold with its reason replaces it). The lease
   is the record: were the status write lost, the next reconcile finds the lease in flight,
   and the next sequence is past every sequence the policy's leases carry, so a name is never
   used twice. With
   ``dryRun`` no lease is written; the decision is in the status and an Event.

Decisions (Lend, Reclaim, dry-run ones) are Events on the policy (reasons ``Lend``,
``Reclaim``, ``DryRun``; ``DemandFallback``, ``DemandUnknown``, ``ForecastTrained``,
``ForecastNotTrained``, ``InvalidPolicy``) and ``flexlease_autopilot_*`` metrics
(:mod:`extender.autopilot.metrics`). A policy is reconciled at least every
``autopilot.resync_seconds``, and again when its plan's target changes before then, when its
spec changes (not its status) and when a lease of its owner changes. Time comes only from the
injected clock, the store only through :class:`flexlease.store.base.Store` and metrics only
through a :class:`~extender.autopilot.prometheus.MetricsSource`, so the simulator can run this
very controller (issue #40, phase 2).

Entry points: :func:`cleanup_ctx` (the extender's wiring; leader only), :func:`serve`,
:class:`AutopilotController` (``run``, ``ready``, ``idle``, ``reconcile``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from extender import tasks
from extender.autopilot import demand, leadtime
from extender.autopilot.metrics import AutopilotMetrics
from extender.autopilot.plan import Allocation, build_plan, decide, plan_start, plan_steps
from extender.autopilot.prometheus import MetricsSource, PrometheusSource
from extender.lease.mirror import Mirror
from extender.lease.planner import set_condition
from extender.lease.view import Holder, assemble, read_holder, salvaged_holder
from extender.lease.workqueue import WorkQueue, warn_and_retry
from extender.orchestrator import profile as profiles
from flexlease.api import keys
from flexlease.api.pod import parse_pod
from flexlease.api.policy import (
    Decision,
    DecisionAction,
    GPULeasePolicy,
    GPULeasePolicyStatus,
    PlanSegment,
    PlanStatus,
    parse_policy,
)
from flexlease.api.resources import (
    FINAL_PHASES,
    GPULeaseSpec,
    GPUNode,
    LeaseAction,
    parse_gpunode,
)
from flexlease.clock import Clock, SystemClock, format_time
from flexlease.config import Settings
from flexlease.errors import Conflict, NotFound, PodSpecError
from flexlease.logging import ctx
from flexlease.store.base import EventType as WatchType
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.kube_util import EventRecorder
from flexlease.store.leader import LeaderElector, run_leader_only

log = logging.getLogger(__name__)

POLICY_PREFIX: Final = "policy/"
COMPONENT: Final = "flexlease-autopilot"
COND_VALID: Final = "Valid"
COND_DEMAND: Final = "DemandKnown"
COND_IN_FLIGHT: Final = "LeaseInFlight"
MIN_REQUEUE_SECONDS: Final = 1.0
FINISHED: Final = frozenset(phase.value for phase in FINAL_PHASES)
"""Phases after which a lease is no longer in flight (a Cancelled one was superseded by a newer
lease of its owner; see ``docs/concepts/right-of-return.md``)."""


def policy_key(namespace: str, name: str) -> str:
    """The work-queue key of a GPULeasePolicy: ``policy/<namespace>/<name>``."""
    return f"{POLICY_PREFIX}{namespace}/{name}"


def _meta(obj: JsonObj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def lease_owner(obj: JsonObj) -> str | None:
    """``spec.owner`` of a GPULease JSON object, None when absent."""
    spec = obj.get("spec")
    owner = spec.get("owner") if isinstance(spec, dict) else None
    return owner if isinstance(owner, str) else None


def in_flight(leases: list[JsonObj], owner: str) -> list[str]:
    """Names of ``owner``'s GPULeases not in a final phase (Done, Failed, Cancelled); a lease
    not yet reconciled has none: in flight too."""
    out: list[str] = []
    for obj in leases:
        status = obj.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        if lease_owner(obj) == owner and phase not in FINISHED:
            out.append(str(_meta(obj).get("name")))
    return out


def created_within_second(leases: list[JsonObj], owner: str, now: float) -> bool:
    """Whether a GPULease of ``owner`` has the ``creationTimestamp`` of the whole second of
    ``now``. ``creationTimestamp`` has whole seconds, and the lease controller orders an
    owner's leases by (creationTimestamp, name): a Lend written in the second its Reclaim was
    written would sort by name and could count as older than the Reclaim (and be Cancelled as
    superseded by it), so the autopilot writes its next lease a second later. A missing or
    unreadable timestamp does not count. Only the same second counts (the API server's clock
    may be ahead of this one: a later timestamp must not hold the autopilot), so with clocks
    skewed by a second or more the tie is not avoided; a Cancelled lease then is final and the
    next reconcile decides afresh."""
    second = float(int(now))
    for obj in leases:
        stamp = _meta(obj).get("creationTimestamp")
        if lease_owner(obj) != owner or not isinstance(stamp, str):
            continue
        try:
            created = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            continue
        if second <= created < second + 1.0:
            return True
    return False


def next_sequence(policy: GPULeasePolicy, leases: list[JsonObj]) -> int:
    """One past every sequence the policy used: its ``lastDecision`` and the
    ``flexlease.io/policy-sequence`` labels of its leases in ``leases``."""
    used = [policy.status.last_decision.sequence] if policy.status.last_decision is not None else []
    for obj in leases:
        labels = _meta(obj).get("labels") or {}
        if labels.get(keys.LABEL_POLICY) == policy.metadata.name:
            raw = labels.get(keys.LABEL_POLICY_SEQUENCE, "")
            if isinstance(raw, str) and raw.isdigit():
                used.append(int(raw))
    return max(used, default=0) + 1


def lease_object(policy: GPULeasePolicy, action: DecisionAction, count: int, *, sequence: int) -> JsonObj:
    """The GPULease of a decision: ``count`` GPUs, the policy's grace period, named and labelled
    after the policy and the sequence (see the module docstring)."""
    name = f"{policy.metadata.name}-{action.value.lower()}-{sequence}"
    spec = GPULeaseSpec(
        owner=policy.spec.owner,
        action=LeaseAction(action.value),
        count=count,
        grace_period_seconds=policy.spec.grace_period_seconds,
    )
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASE_KIND,
        "metadata": {
            "name": name,
            "namespace": policy.spec.namespace,
            "labels": {keys.LABEL_POLICY: policy.metadata.name, keys.LABEL_POLICY_SEQUENCE: str(sequence)},
        },
        "spec": spec.to_json_obj(),
    }


def job_artifacts(pods: list[JsonObj], owner: str, resource: str) -> leadtime.JobArtifacts:
    """The image (first container's) and checkpoint (``flexlease.io/checkpoint``) the owner's
    pods start from, first pod by name first; None each when no pod names one."""
    image: str | None = None
    checkpoint: str | None = None
    for pod in sorted(pods, key=lambda p: str(_meta(p).get("name"))):
        try:
            request = parse_pod(pod, resource)
        except PodSpecError:
            continue
        if request.owner != owner:
            continue
        containers = (pod.get("spec") or {}).get("containers") or []
        if image is None and containers and isinstance(containers[0].get("image"), str):
            image = containers[0]["image"]
        ann = (_meta(pod).get("annotations") or {}).get(keys.ANN_CHECKPOINT)
        if checkpoint is None and isinstance(ann, str):
            checkpoint = ann
    return leadtime.JobArtifacts(image=image, checkpoint=checkpoint)


class AutopilotController:
    """Reconciles GPULeasePolicies (see the module docstring).

    ``settings``: the root settings (``autopilot``, ``extender.gpu_resource`` and
    ``orchestrator.profile_dirs`` are read); ``registry``: where the metrics go; ``clock``: all
    time (default: the system clock); ``metrics_source``: where the prometheus and forecast
    sources read (default: a :class:`PrometheusSource` on ``autopilot.prometheus_url`` when
    set); ``instance``: ``reportingInstance`` of its Events (default: the host name).
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        metrics_source: MetricsSource | None = None,
        instance: str | None = None,
    ) -> None:
        self._settings = settings.autopilot
        self._resource = settings.extender.gpu_resource
        self._critical = profiles.critical_for(settings.orchestrator.profile_dirs)
        self._store = store
        self._clock: Clock = clock or SystemClock()
        if metrics_source is None and self._settings.prometheus_url:
            metrics_source = PrometheusSource(
                self._settings.prometheus_url, timeout_seconds=self._settings.prometheus_timeout_seconds
            )
        self._source = metrics_source
        self.metrics = AutopilotMetrics(registry)
        self._queue = WorkQueue(
            self._clock,
            base_delay=self._settings.retry_base_seconds,
            max_delay=self._settings.retry_max_seconds,
        )
        self._warn = warn_and_retry("autopilot reconcile", quiet=Conflict, logger=log)
        self._policies = Mirror(store, Kind.GPULEASEPOLICY, on_change=self._policy_changed)
        self._leases = Mirror(store, Kind.GPULEASE, on_change=self._lease_changed)
        self._nodes = Mirror(store, Kind.GPUNODE, on_change=lambda _type, _obj: None)
        self._events = EventRecorder(
            store, component=COMPONENT, instance=instance or socket.gethostname(), clock=self._clock
        )
        self._generations: dict[str, object] = {}
        """Policy key → the ``metadata.generation`` last seen: a status write (ours) does not
        enqueue the policy again, a spec change does."""
        self._parsed_nodes: dict[str, tuple[str, GPUNode | None]] = {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        """True once policies, leases and GPUNodes have each been listed."""
        return all(m.listed.is_set() for m in (self._policies, self._leases, self._nodes))

    @property
    def idle(self) -> bool:
        """No key ready or being reconciled (a simulation steps time when this holds)."""
        return self._queue.idle

    async def run(self) -> None:
        """Watch and reconcile until cancelled (named tasks in one TaskGroup)."""
        log.info("lease autopilot starting", extra=ctx(resync_seconds=self._settings.resync_seconds))
        self._enqueue_all()  # after a restart of run() (leadership regained) look at every policy
        async with asyncio.TaskGroup() as group:
            for mirror in (self._policies, self._leases, self._nodes):
                group.create_task(mirror.run(), name=f"autopilot-mirror-{mirror.kind.value}")
            group.create_task(self._resync(), name="autopilot-resync")
            group.create_task(self._work(), name="autopilot-worker")

    async def _resync(self) -> None:
        tick = asyncio.Event()
        while True:
            tick.clear()
            await self._clock.wait(tick, self._settings.resync_seconds)
            self._enqueue_all()

    async def _work(self) -> None:
        while True:
            await self._queue.process_next(self.reconcile, on_error=self._failed)

    def _failed(self, key: str, exc: Exception, backoff: float) -> None:
        self.metrics.reconcile_errors.inc()
        self._warn(key, exc, backoff)

    # ------------------------------------------------------------------ triggers

    def _enqueue_all(self) -> None:
        for obj in self._policies.values():
            meta = _meta(obj)
            self._queue.add(policy_key(str(meta.get("namespace") or ""), str(meta.get("name") or "")))

    def _policy_changed(self, type: WatchType, obj: JsonObj) -> None:
        meta = _meta(obj)
        key = policy_key(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        generation = meta.get("generation")
        if type is WatchType.DELETED:
            self._generations.pop(key, None)
        elif type is WatchType.MODIFIED and self._generations.get(key) == generation:
            return  # only the status moved (our own write): nothing to plan anew
        else:
            self._generations[key] = generation
        self._queue.add(key)

    def _lease_changed(self, type: WatchType, obj: JsonObj) -> None:
        meta = _meta(obj)
        namespace = str(meta.get("namespace") or "")
        owner = lease_owner(obj)
        for policy in self._policies.values():
            pmeta = _meta(policy)
            spec = policy.get("spec")
            if pmeta.get("namespace") == namespace and isinstance(spec, dict) and spec.get("owner") == owner:
                self._queue.add(policy_key(namespace, str(pmeta.get("name") or "")))

    # ------------------------------------------------------------------ reading

    def _gpunodes(self) -> dict[str, GPUNode]:
        """The mirrored GPUNodes, parsed (memoised per resourceVersion; invalid ones skipped)."""
        out: dict[str, GPUNode] = {}
        seen: set[str] = set()
        for obj in self._nodes.values():
            name = str(_meta(obj).get("name") or "")
            version = str(_meta(obj).get("resourceVersion") or "")
            seen.add(name)
            cached = self._parsed_nodes.get(name)
            if cached is None or cached[0] != version:
                try:
                    node: GPUNode | None = parse_gpunode(obj)
                except ValidationError as exc:
                    log.warning("GPUNode skipped: invalid", extra=ctx(node=name, error=str(exc)))
                    node = None
                cached = (version, node)
                self._parsed_nodes[name] = cached
            if cached[1] is not None:
                out[name] = cached[1]
        for gone in set(self._parsed_nodes) - seen:
            del self._parsed_nodes[gone]
        return out

    def _holders(self, pods: list[JsonObj]) -> list[Holder]:
        out: list[Holder] = []
        for pod in pods:
            try:
                holder = read_holder(pod, self._resource, critical=self._critical)
            except PodSpecError:
                holder = salvaged_holder(pod)  # held by nobody's job: never the owner's
            if holder is not None:
                out.append(holder)
        return out

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> float | None:
        """Reconcile one policy key once; returns seconds until it wants to be reconciled again
        (None: only on change). Raises ``StoreError`` (``Conflict`` when the status moved under
        it) for the work queue's back-off, ``ValueError`` on a key that is not a policy's."""
        if not key.startswith(POLICY_PREFIX) or key.count("/") != 2:
            raise ValueError(f"unknown work-queue key {key!r}")
        namespace, name = key[len(POLICY_PREFIX) :].split("/")
        try:
            raw = await self._store.get(Kind.GPULEASEPOLICY, name, namespace=namespace)
        except NotFound:
            self.metrics.forget(f"{namespace}/{name}")
            return None
        self._policies.put(raw)
        try:
            policy = parse_policy(raw)
        except ValidationError as exc:
            message = "invalid policy: " + "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            await self._invalid(raw, message)
            return None
        if policy.spec.namespace != namespace:
            await self._invalid(
                raw,
                f"invalid policy: spec.owner {policy.spec.owner} is not in the policy's "
                f"namespace {namespace}",
            )
            return None
        return await self._reconcile_policy(policy, raw)

    async def _reconcile_policy(self, policy: GPULeasePolicy, raw: JsonObj) -> float | None:
        spec = policy.spec
        owner = spec.owner
        label = f"{policy.metadata.namespace}/{policy.metadata.name}"
        now = self._clock.now()

        pods = (await self._store.list(Kind.POD, namespace=spec.namespace)).items
        nodes = self._gpunodes()
        view = assemble(nodes.values(), self._holders(pods))
        held = view.held_by(owner)
        critical = {d for h in view.holders.values() if h.belongs_to(owner) and h.critical for d in h.devices}
        lent = [g for g in view.tagged(owner) if g.key not in held]
        have = Allocation(allocated=len(held), lendable=len(held - critical), outstanding=len(lent))

        if isinstance(spec.lead_time, int):
            lead = leadtime.fixed(spec.lead_time)
        else:
            lead = leadtime.auto(
                nodes,
                job_artifacts(pods, owner, self._resource),
                lent_on=[g.key.node for g in lent],
                grace_seconds=spec.grace_period_seconds,
                resync_seconds=self._settings.resync_seconds,
            )

        start = plan_start(now, spec.step_seconds)
        outcome = await demand.read(
            spec,
            status=policy.status,
            source=self._source,
            allocated=have.allocated,
            now=now,
            start=start,
            steps=plan_steps(spec.step_seconds),
            retrain_seconds=self._settings.forecast_retrain_seconds,
            forecast_step_seconds=self._settings.forecast_step_seconds,
        )
        plan = build_plan(outcome.series, start=start, spec=spec) if outcome.series is not None else None
        target = plan.target(now, lead.seconds) if plan is not None else None

        leases = (await self._store.list(Kind.GPULEASE, namespace=spec.namespace)).items
        flying = in_flight(leases, owner)
        verdict = decide(target, have, in_flight=flying)
        decision = policy.status.last_decision
        previous_sequence = decision.sequence if decision is not None else 0
        if verdict.action is DecisionAction.HOLD:
            # a Lend or Reclaim stays the last decision while its lease is carried out
            carried_out = decision is not None and decision.lease is not None and decision.lease in flying
            if not carried_out and (decision is None or decision.reason != verdict.reason):
                decision = Decision(
                    at=_utc(now), action=verdict.action, reason=verdict.reason, sequence=previous_sequence
                )
        elif spec.dry_run:
            same = (
                decision is not None
                and decision.dry_run
                and (decision.action, decision.count) == (verdict.action, verdict.count)
            )
            if not same:
                decision = Decision(
                    at=_utc(now),
                    action=verdict.action,
                    count=verdict.count,
                    dry_run=True,
                    reason=verdict.reason,
                    sequence=previous_sequence,
                )
                self.metrics.decisions.labels(policy=label, action=verdict.action.value, dry_run="true").inc()
                await self._record(
                    raw,
                    "DryRun",
                    f"dry run: would {verdict.action.value} {verdict.count} GPUs for {owner} "
                    f"({verdict.reason}); no lease written",
                )
                log.info(
                    "autopilot dry run",
                    extra=ctx(policy=label, owner=owner, action=verdict.action.value, gpus=verdict.count),
                )
        elif created_within_second(leases, owner, now):
            log.debug("autopilot waits a second", extra=ctx(policy=label, owner=owner))
            return MIN_REQUEUE_SECONDS  # see created_within_second: then decided afresh
        else:
            sequence = next_sequence(policy, leases)
            obj = lease_object(policy, verdict.action, verdict.count, sequence=sequence)
            lease_name = str(obj["metadata"]["name"])
            try:
                created = await self._store.create(Kind.GPULEASE, obj)
            except Conflict:
                # written before a lost status write, or by a racing replica: in flight now
                log.info("autopilot lease exists already", extra=ctx(policy=label, lease=lease_name))
                return MIN_REQUEUE_SECONDS
            self._leases.put(created)
            flying = [lease_name]
            decision = Decision(
                at=_utc(now),
                action=verdict.action,
                count=verdict.count,
                lease=lease_name,
                reason=verdict.reason,
                sequence=sequence,
            )
            self.metrics.decisions.labels(policy=label, action=verdict.action.value, dry_run="false").inc()
            log.info(
                "autopilot lease",
                extra=ctx(
                    policy=label,
                    owner=owner,
                    lease=lease_name,
                    action=verdict.action.value,
                    gpus=verdict.count,
                ),
            )
            await self._record(
                raw,
                verdict.action.value,
                f"GPULease {lease_name}: {verdict.action.value} {verdict.count} GPUs of {owner} "
                f"({verdict.reason}; demand {outcome.demand.source}, lead time {lead.seconds:.0f}s)",
            )

        for note in outcome.notes:
            if note.warning:
                self.metrics.fallbacks.labels(policy=label, reason=note.reason).inc()
            await self._record(raw, note.reason, note.message, warning=note.warning)

        status = self._status(
            policy,
            outcome=outcome,
            plan_status=None
            if plan is None
            else PlanStatus(
                computed_at=_utc(now),
                step_seconds=spec.step_seconds,
                lead_time_seconds=round(lead.seconds, 3),
                lead_time_source=lead.source,
                target_gpus=target if target is not None else have.allocated,
                allocated_gpus=have.allocated,
                lent_gpus=have.outstanding,
                segments=[PlanSegment(start=_utc(at), gpus=g) for at, g in plan.changes()],
            ),
            decision=decision,
            flying=flying,
            now=now,
        )
        await self._store.patch(
            Kind.GPULEASEPOLICY,
            policy.metadata.name,
            {"status": status.model_dump(mode="json", by_alias=True)},
            namespace=policy.metadata.namespace,
            subresource="status",
            resource_version=policy.metadata.resource_version,
        )
        self._gauges(label, outcome=outcome, target=target, have=have, lead=lead.seconds)
        delay = self._settings.resync_seconds
        if plan is not None:
            change = plan.next_change(now, lead.seconds)
            if change is not None:
                delay = min(delay, max(MIN_REQUEUE_SECONDS, change))
        return delay

    def _status(
        self,
        policy: GPULeasePolicy,
        *,
        outcome: demand.DemandOutcome,
        plan_status: PlanStatus | None,
        decision: Decision | None,
        flying: list[str],
        now: float,
    ) -> GPULeasePolicyStatus:
        when = _utc(now)
        conditions = set_condition(
            policy.status.conditions, type=COND_VALID, status=True, reason="Accepted", message="", now=when
        )
        known = outcome.series is not None
        conditions = set_condition(
            conditions,
            type=COND_DEMAND,
            status=known,
            reason=outcome.demand.source[:1].upper() + outcome.demand.source[1:],
            message=outcome.demand.message,
            now=when,
        )
        conditions = set_condition(
            conditions,
            type=COND_IN_FLIGHT,
            status=bool(flying),
            reason="LeaseInFlight" if flying else "NoLeaseInFlight",
            message=", ".join(sorted(flying)),
            now=when,
        )
        forecast = outcome.forecast if policy.spec.demand.forecast is not None else None
        return GPULeasePolicyStatus(
            observed_generation=policy.metadata.generation,
            demand=outcome.demand,
            plan=plan_status,
            forecast=forecast,
            last_decision=decision,
            conditions=conditions,
        )

    def _gauges(
        self, label: str, *, outcome: demand.DemandOutcome, target: int | None, have: Allocation, lead: float
    ) -> None:
        if outcome.demand.gpus is not None:
            self.metrics.demand.labels(policy=label).set(outcome.demand.gpus)
        if target is not None:
            self.metrics.target.labels(policy=label).set(target)
        self.metrics.allocated.labels(policy=label).set(have.allocated)
        self.metrics.lent.labels(policy=label).set(have.outstanding)
        self.metrics.lead.labels(policy=label).set(lead)
        if outcome.forecast is not None and outcome.forecast.mape is not None:
            self.metrics.mape.labels(policy=label).set(outcome.forecast.mape)

    async def _invalid(self, raw: JsonObj, message: str) -> None:
        """Condition ``Valid=False`` with ``message`` and a Warning Event, once per message."""
        meta = _meta(raw)
        status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
        conditions = status.get("conditions") if isinstance(status, dict) else None
        for cond in conditions if isinstance(conditions, list) else []:
            if isinstance(cond, dict) and cond.get("type") == COND_VALID and cond.get("message") == message:
                return
        condition = {
            "type": COND_VALID,
            "status": "False",
            "reason": "InvalidPolicy",
            "message": message,
            "lastTransitionTime": format_time(self._clock.now_utc()),
        }
        await self._store.patch(
            Kind.GPULEASEPOLICY,
            str(meta.get("name")),
            {"status": {"conditions": [condition]}},
            namespace=str(meta.get("namespace")),
            subresource="status",
            resource_version=meta.get("resourceVersion"),
        )
        log.warning(
            "invalid GPULeasePolicy",
            extra=ctx(policy=f"{meta.get('namespace')}/{meta.get('name')}", error=message),
        )
        await self._record(raw, "InvalidPolicy", message, warning=True)

    async def _record(self, raw: JsonObj, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the policy (best effort: a failed write is logged by the recorder)."""
        await self._events.record(
            raw, type="Warning" if warning else "Normal", reason=reason, message=message
        )


async def serve(
    controller: AutopilotController,
    settings: Settings,
    *,
    store: Store,
    instance: str,
    elector: LeaderElector | None = None,
) -> None:
    """Run ``controller`` until cancelled; with ``settings.lease.leader_election`` only while
    this replica leads (sharing ``elector`` when given, else running its own)."""
    await run_leader_only(
        controller.run, settings.lease, store=store, instance=instance, name="autopilot", elector=elector
    )


AUTOPILOT: Final = web.AppKey("autopilot", AutopilotController)
"""Where :func:`cleanup_ctx` puts the controller (for ``/readyz`` and tests)."""


def cleanup_ctx(
    settings: Settings,
    store: Store,
    *,
    registry: CollectorRegistry,
    clock: Clock | None = None,
    instance: str | None = None,
    elector: LeaderElector | None = None,
    metrics_source: MetricsSource | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running the autopilot (see :func:`serve`) as the task
    ``autopilot`` for the application's lifetime, stored under :data:`AUTOPILOT`. Runs nothing
    when ``settings.autopilot.enabled`` or ``settings.lease.enabled`` is false (its leases would
    have no lease controller to carry them out)."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        if not (settings.autopilot.enabled and settings.lease.enabled):
            log.info("lease autopilot disabled")
            yield
            return
        name = instance or socket.gethostname()
        controller = AutopilotController(
            settings, store, registry=registry, clock=clock, metrics_source=metrics_source, instance=name
        )
        app[AUTOPILOT] = controller
        work = serve(controller, settings, store=store, instance=name, elector=elector)
        async with tasks.running(work, name="autopilot"):
            yield

    return context
