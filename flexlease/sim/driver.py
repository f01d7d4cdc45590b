"""The simulation driver: plays API clients, kubelet, node agents, the online job's controller
and kube-scheduler around the real extender (WeFlex §4.3.2, §4.4, §4.7; DESIGN §5).

One :class:`Simulation` runs one policy on a virtual clock. Each tick (``Scenario.tick``
simulated seconds) it:

1. updates GPU health and tiers as the node agents would (outages from
   :mod:`flexlease.sim.failures`, tiers from :mod:`flexlease.sim.tiering`) and patches the
   ``GPUNode`` status of every node that changed;
2. finishes LP pods whose run time is over (status ``Succeeded``, then deleted);
3. scales the online job — under the lease autopilot (``Scenario.autopilot``) by following the
   GPULeases it writes (:meth:`Simulation.follow_policy`), else as follows — with the tide
   (:mod:`flexlease.sim.tide`): scale-down deletes the
   newest pods holding half its GPUs and, with right-of-return, writes a ``GPULease`` Lend
   with those devices; scale-up writes a Reclaim with the lent count, creates pods pinned
   (required hostname affinity) to the GPUs tagged for the job, and schedules them as the
   controller evicts LP pods; without right-of-return it creates pods that take any GPUs;
4. creates the LP pods arriving in the tick and withdraws those pending past their patience;
5. lets the extender settle (its store watches delivered, the lease controller idle), then
   runs a scheduling round: ``/filter`` → ``/prioritize`` → ``/bind`` for each pending pod
   (high priority first, then oldest), ``/preempt`` + eviction when a high-priority pod fits
   nowhere but ``FailedNodes`` says preemption may help;
6. checks the invariants (:class:`Invariants`) and samples the metrics every simulated hour.

One virtual clock (:class:`flexlease.clock.ManualClock`) drives everything: the simulator,
the hosted extender's lease controller (grace periods, back-offs, resyncs) and its
inventory. Between ticks time moves from one of the controller's deadlines to the next, and
the extender settles at each (:class:`ExtenderHost`), so the same seed and arguments give
the same run, byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError

from flexlease import rightofreturn
from flexlease.api import keys, resources
from flexlease.api.pod import Assignment
from flexlease.api.resources import FINAL_PHASES, DeviceKey, GPULease, LeaseAction, LeasePhase, Pool
from flexlease.api.tiers import Tier
from flexlease.clock import ManualClock
from flexlease.errors import FlexleaseError, NotFound, PodSpecError, StoreError, TooManyRequests
from flexlease.logging import ctx
from flexlease.sim import demandtrace, failures, leasepolicy, metrics, objects, tide, tiering, traces
from flexlease.sim.extender_client import ExtenderCallError, ExtenderClient
from flexlease.sim.scenario import Policy, Scenario, assign_models
from flexlease.store import graceful, semantics
from flexlease.store.base import EventType, JsonObj, Kind, Store, WatchEvent
from flexlease.store.informer import Informer

log = logging.getLogger(__name__)

JOB_NAMESPACE: Final = "online"
JOB_NAME: Final = "trainer"
JOB_OWNER: Final = f"{JOB_NAMESPACE}/{JOB_NAME}"
LP_NAMESPACE: Final = "tenants"
SIM_NAMESPACE: Final = "sim-system"
EPOCH: Final = datetime(2026, 1, 5, tzinfo=UTC)
"""Simulated t = 0 (a Monday, 00:00 UTC), for timestamps in objects."""
MAX_CONSECUTIVE_ERRORS: Final = 50


class SimulationError(FlexleaseError):
    """The simulation cannot go on (extender gone, store failing, a bound exceeded)."""


def sim_time(t: float) -> datetime:
    """Simulated seconds → an aware UTC datetime."""
    return EPOCH + timedelta(seconds=t)


@dataclass(slots=True)
class SimPod:
    """A pod the simulator created, as it tracks it."""

    name: str
    namespace: str
    uid: str
    obj: JsonObj
    gpus: int
    high: bool
    created: float
    seq: int
    reclaim: bool = False
    pinned: str | None = None
    node: str | None = None
    devices: tuple[DeviceKey, ...] = ()
    bound_at: float | None = None
    job: int | None = None
    """The LP job (gang) the pod belongs to (key of ``Simulation.lp_jobs``)."""


@dataclass(slots=True)
class LpJob:
    """A low-priority job as a batch scheduler keeps it: a gang of pods (``sizes`` GPUs
    each) that runs only when all are bound, retried with back-off while it does not fit,
    and resubmitted (with the run time it has left, as from a checkpoint) when one of its
    pods is evicted, preempted or killed."""

    id: int
    sizes: tuple[int, ...]
    remaining: float
    request: int
    """Index of its :class:`metrics.LpRequest` (the first submission's)."""
    submitted: float
    model: str | None = None
    """The GPU model it asks for (None: any)."""
    pods: list[str] = field(default_factory=list)
    started: float | None = None
    attempts: int = 0
    retry_at: float = 0.0
    resubmissions: int = 0

    @property
    def gpus(self) -> int:
        return sum(self.sizes)


@dataclass(slots=True)
class GpuState:
    outages: tuple[failures.Interval, ...]
    tier: tiering.GpuTier
    healthy: bool = True


@dataclass(slots=True)
class RunStats:
    """Counters reported per policy."""

    scheduling_cycles: int = 0
    bound: Counter[str] = field(default_factory=Counter)
    unschedulable: int = 0
    bind_errors: int = 0
    preemption_attempts: int = 0
    preempted_lp_pods: int = 0
    evicted_by_controller: int = 0
    withdrawn_lp_jobs: int = 0
    completed_lp_jobs: int = 0
    lp_gang_rollbacks: int = 0
    lp_resubmissions: int = 0
    double_allocations: int = 0
    assignment_mismatches: int = 0
    job_pods_killed: int = 0
    lp_pods_killed: int = 0
    job_restarts: int = 0
    job_interruption_s: float = 0.0
    settles: int = 0
    status_patches: int = 0
    controller_timeouts: int = 0
    store_errors: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DemandStats:
    """How well the job's GPUs met its demand, per tick after the warm-up (seconds, GPU-seconds):
    time and GPU-seconds below the demand (``ceil`` of the trace), GPU-seconds above it, and
    GPU-seconds lent (tagged for the job)."""

    seconds: float = 0.0
    below_s: float = 0.0
    below_gpu_s: float = 0.0
    above_gpu_s: float = 0.0
    held_gpu_s: float = 0.0
    lent_gpu_s: float = 0.0
    lends: int = 0
    reclaims: int = 0
    lent_by_policy: int = 0
    reclaimed_by_policy: int = 0


class Invariants:
    """What must hold at every step of a run, with a count of each violation (a run with any
    non-zero count fails). Keys:

    * ``job_above_peak``: the online job holds more GPUs than its peak allocation;
    * ``gpu_held_twice``: one GPU in the ``assigned-gpus`` of two live pods in the store;
    * ``lp_on_standby``: a low-priority pod holds a GPU of a standby-pool node;
    * right-of-return, from device identities (:mod:`flexlease.rightofreturn`, observed after
      every step): ``reclaim_done_without_gpus`` (a Done Reclaim's owner does not hold a
      target nor its replacement, and it is not unrecoverable), ``reclaim_lost_gpus`` (a
      Cancelled or Failed Reclaim left a target with no outcome), ``lent_gpu_untagged`` (a GPU
      out on loan not tagged for its owner), ``reclaim_skipped_lent_gpus`` (a scale-up's
      Reclaim left lent GPUs out), ``replacement_mismatch`` (a replacement of another model or
      a lower tier than the lend-time record);
    * ``cycle_unaccounted``: a closed cycle where lent + carried in is not returned before the
      reclaim + back + replaced + unrecoverable + still lent, each GPU counted by identity, or
      a lent GPU has none of these (``lost``);
    * ``job_full_beside_lent_gpus``: the job holds its full size while a healthy GPU tagged for
      it is free (its pods took other GPUs instead of the ones it lent);
    * ``reclaim_events_missing``: a finished Reclaim lists more standby supplements than the
      lease controller announced in ``Supplemented`` Events;
    * ``supplement_model_mismatch``: a standby supplement of another GPU model than the
      lent GPU it replaces (the simulated hardware's models);
    * ``assignment_mismatches``: bind's ``assigned-gpus``/``nodeName`` disagree with the
      node chosen or the GPUs asked for.
    """

    NAMES: Final = (
        "job_above_peak",
        "gpu_held_twice",
        "lp_on_standby",
        *rightofreturn.INVARIANTS,
        "cycle_unaccounted",
        "job_full_beside_lent_gpus",
        "reclaim_events_missing",
        "supplement_model_mismatch",
        "assignment_mismatches",
    )

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter({name: 0 for name in self.NAMES})
        self.checks = 0
        self.first: dict[str, str] = {}

    def violated(self, name: str, detail: str) -> None:
        """Count one violation of ``name`` (one of :data:`NAMES`); the first detail is kept."""
        self.counts[name] += 1
        self.first.setdefault(name, detail)
        log.warning("invariant violated", extra=ctx(invariant=name, detail=detail))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "checks": self.checks,
            "violations": dict(sorted(self.counts.items())),
            "total": self.total,
            "first": dict(sorted(self.first.items())),
        }


class ExtenderHost:
    """What the simulation needs from the hosted extender (``extender.simhost``): its URL, a
    way to wait until it is quiescent, and a way to hold its lease controller. ``settle``
    returns once every store change has been delivered to the extender and its lease
    controller has nothing left to do at this instant (while held: nothing under way);
    ``paused()`` is an async context manager holding the controller for its body."""

    def __init__(
        self,
        url: str,
        settle: Callable[[], Awaitable[object]],
        paused: Callable[[], contextlib.AbstractAsyncContextManager[None]],
    ) -> None:
        self.url = url
        self.settle = settle
        self.paused = paused


@dataclass(frozen=True, slots=True)
class World:
    """The inputs shared by both policies: LP arrivals, tide, failure histories."""

    arrivals: tuple[traces.PodArrival, ...]
    lp_source: str
    tide: demandtrace.DemandTrace
    """The online job's demand: the tide with the scenario's noise and surprise peaks."""
    tide_source: str
    outages: dict[DeviceKey, tuple[failures.Interval, ...]]
    model: failures.FailureModel
    gpu_models: dict[str, str]
    """Node → GPU model (NVML product name)."""
    lp_phase: dict[str, Any] = field(default_factory=dict)
    """Where the LP arrivals sit in the day (:func:`lp_daily_phase`), for the report."""


def general_nodes(scenario: Scenario) -> list[str]:
    """Names of the general-pool nodes: ``gpu-000`` …"""
    return [f"gpu-{i:03d}" for i in range(scenario.nodes)]


def standby_nodes(scenario: Scenario) -> list[str]:
    """Names of the standby-pool nodes: ``standby-00`` …"""
    return [f"standby-{i:02d}" for i in range(scenario.standby_nodes)]


class Simulation:
    """One policy's run. Create, then ``await run()``; the result is :meth:`report`."""

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        *,
        world: World,
        store: Store,
        client: ExtenderClient,
        clock: ManualClock,
        host: ExtenderHost,
    ) -> None:
        self.s = scenario
        self.policy = policy
        self.world = world
        self.store = store
        self.client = client
        self.clock = clock
        self.host = host
        self.origin = clock.now()
        """Epoch seconds of simulated t = 0."""
        self.invariants = Invariants()
        self.reclaim_started: float | None = None
        self.job_model = scenario.gpu_models[0][0] if scenario.mixed else None
        """The GPU model the online job asks for (None: any, in a one-model cluster)."""
        self.job_target = scenario.job_gpus
        """GPUs the job's controller keeps pods for: its peak, or what is left after a
        scale-down."""
        self.pools: dict[str, Pool] = {}
        """Each node's pool as the store had it at the last check (the lease controller
        moves whole free nodes in and out of the standby pool)."""
        self._watched_pools: dict[str, Pool] = {}
        self._gpunodes = Informer(store, Kind.GPUNODE, handler=self._gpunode_event, name="sim-gpunodes")
        """The store's GPUNodes as its watch delivers them, for the pools checked every tick
        and the job's ownership tags (reading them from a watch instead of listing every
        GPUNode each tick: the lease controller moves nodes only while the extender settles,
        which also waits for this watch to have delivered every change)."""
        self._leases = Informer(store, Kind.GPULEASE, handler=self._lease_event, name="sim-leases")
        """The store's GPULeases as its watch delivers them, parsed once per change into
        :attr:`_lease_objs`, for the right-of-return audit."""
        self._lease_objs: dict[str, GPULease] = {}
        self._tags: dict[DeviceKey, str] = {}
        """Right-of-return tags (``GPUNode.spec.devices[i].owner``) as the GPUNode watch has them."""
        self._node_tags: dict[str, tuple[DeviceKey, ...]] = {}
        self.audit = rightofreturn.Audit()
        """The right-of-return invariants, from device identities (:meth:`observe`)."""
        self._listed_pods = Informer(store, Kind.POD, handler=_ignore, name="sim-pods")
        """The store's Pods as its watch delivers them, for the hourly look at every pod
        (:meth:`reconcile_pods`, :meth:`check_invariants`): what a list would return once the
        watches caught up (:meth:`caught_up`), each change decoded once instead of every
        live pod twice an hour."""
        self.rng = random.Random(f"scheduler:{scenario.seed}")
        self.tiers = tiering.TierPolicy(window=scenario.tier_window, refresh=scenario.tier_refresh)
        self.general = general_nodes(scenario)
        self.standby = standby_nodes(scenario)
        self.candidates = self.general + self.standby
        self.gpus: dict[DeviceKey, GpuState] = {}
        self._sweep: failures.OutageSweep[DeviceKey] | None = None
        """Which GPUs' outages touch each tick (built at the first tick, from ``gpus``)."""
        self._unhealthy: set[DeviceKey] = set()
        self._gpu_order: dict[DeviceKey, int] = {}
        self.pods: dict[str, SimPod] = {}  # uid → pod (live: pending or bound)
        self.held: dict[DeviceKey, str] = {}  # device → uid
        self.requests: list[metrics.LpRequest] = []
        self.lp_jobs: dict[int, LpJob] = {}
        """LP jobs waiting or running (finished and withdrawn ones are dropped)."""
        self.samples: list[metrics.Sample] = []
        self.cycles: list[metrics.Cycle] = []
        self.stats = RunStats()
        self.size = tide.Scale.FULL
        self.static_set: tuple[DeviceKey, ...] = ()
        self.last_refresh = 0.0
        self.seq = 0
        self.dirty = True
        self.consecutive_errors = 0
        self.controller_missing = False
        self.lend_lease: JsonObj | None = None
        self.arrival_idx = 0
        self.wall_started = 0.0
        self.wall_s = 0.0
        self.cpu_started = 0.0
        self.cpu_s = 0.0
        """CPU seconds (user + system) of this process while the simulation ran: the hosted
        extender's share included, as it runs in the same process."""
        self.policy_kind = tide.ScalePolicy()
        self.released: list[DeviceKey] = []
        self.reclaim_name: str | None = None
        self.autopilot = scenario.autopilot != "off" and policy is Policy.ROR
        """The lease autopilot sizes the job (its leases are followed) instead of the tide policy."""
        self.demand = DemandStats()
        self.job_pod_gpus = 1 if self.autopilot else scenario.gpus_per_node
        """GPUs per pod of the job's unpinned pods: whole nodes under the tide policy (it lends
        half the job, whole pods); one under the autopilot, whose Lends count single GPUs, so
        that a Lend of N deletes pods of exactly N GPUs (the job as data-parallel workers of one
        GPU each)."""
        self._adopted: set[str] = set()
        """The autopilot's GPULeases the job has followed (``<ns>/<name>``)."""

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        """Create every GPUNode with its status at t = 0, and the online job. Raises
        :class:`SimulationError` when the job's GPU model has fewer GPUs than the job."""
        if self.job_model is not None:
            room = sum(1 for n in self.general if self.world.gpu_models[n] == self.job_model)
            if room * self.s.gpus_per_node < self.s.job_gpus:
                raise SimulationError(
                    f"the online job needs {self.s.job_gpus} {self.job_model} GPUs; the general"
                    f" pool has {room * self.s.gpus_per_node}"
                )
        for node in self.candidates:
            for i in range(self.s.gpus_per_node):
                key = DeviceKey(node, i)
                outs = self.world.outages[key]
                self.gpus[key] = GpuState(
                    outs, tiering.refreshed(outs, 0.0, self.tiers), not failures.is_down(outs, 0.0)
                )
                self._gpu_order[key] = len(self._gpu_order)
                if not self.gpus[key].healthy:
                    self._unhealthy.add(key)
        for node in self.candidates:
            pool = Pool.STANDBY if node in self.standby else Pool.GENERAL
            await self.store.create(Kind.GPUNODE, objects.gpunode(node, pool=pool))
            await self._patch_node_status(node, 0.0)
        await self._deploy_online_job()
        if self.autopilot:
            await self.store.create(
                Kind.GPULEASEPOLICY, leasepolicy.policy_object(self.s.autopilot, self.s, owner=JOB_OWNER)
            )
            await self.settle()

    async def _patch_node_status(self, node: str, t: float) -> None:
        devices: dict[str, resources.DeviceStatus] = {}
        for i in range(self.s.gpus_per_node):
            g = self.gpus[DeviceKey(node, i)]
            devices[str(i)] = objects.device_status(
                node,
                i,
                healthy=g.healthy,
                tier=g.tier.tier,
                availability=tiering.availability(g.outages, t, self.tiers),
                computed_at=sim_time(g.tier.computed_at),
                model=self.world.gpu_models[node],
            )
        idx = self.candidates.index(node)
        status = objects.gpunode_status(
            f"10.0.{idx // 250}.{idx % 250 + 1}",
            devices,
            spec=resources.GPUNodeSpec(),
            heartbeat=sim_time(t),
        )
        status.pop("summary", None)  # lent counts depend on spec tags the controller owns
        await self.store.patch(Kind.GPUNODE, node, {"status": status}, subresource="status")
        self.stats.status_patches += 1
        self.dirty = True

    async def _deploy_online_job(self) -> None:
        """Create the job at t = 0 as pods of whole nodes that may go anywhere, and schedule
        them through the extender like any other job's: the placement is drawn, not picked,
        so the job starts near the cluster's HA share (the paper: 74 %)."""
        for size in traces.split_pods(self.s.job_gpus, self.job_pod_gpus):
            await self._create_job_pod(size, 0.0, pinned=None, reclaim=False)
        await self.settle()
        await self._schedule_round(0.0)
        self._note_static_set()

    def _note_static_set(self) -> None:
        """Remember the job's GPUs the first time it holds its full size (the "initial GPUs
        kept" reference); pods that do not fit at t = 0 are retried every round."""
        if not self.static_set:
            devices = tuple(self._job_devices())
            if len(devices) >= self.s.job_gpus:
                self.static_set = devices

    # ------------------------------------------------------------------ time

    async def settle(self) -> None:
        """Wait until the extender has seen every write and its controller is idle."""
        await self.host.settle()
        self.stats.settles += 1

    async def caught_up(self) -> None:
        """Wait until the store's watches, the simulator's own included, have delivered
        every write so far, with the lease controller held (it takes no key meanwhile), so
        that reading a watched cache adds no point at which the controller acts: the run
        stays what it is without the caches."""
        async with self.host.paused():
            await self.host.settle()

    def now(self) -> float:
        """Simulated seconds since t = 0 on the shared clock."""
        return self.clock.now() - self.origin

    async def advance_to(self, t: float) -> None:
        """Move the shared clock to simulated ``t``, stopping at each of the extender's
        deadlines on the way (grace periods, back-offs, resyncs): the extender settles at
        each, and an open reclaim is followed up (evicted pods dropped, reclaim pods pinned
        and scheduled) before time moves on."""
        target = self.origin + t
        while (due := self.clock.next_due()) is not None and due <= target:
            self.clock.jump(max(due, self.clock.now()))
            await self.settle()
            if self.reclaim_name is not None and self.reclaim_started is not None:
                await self._follow_reclaim(due - self.origin)
        if target > self.clock.now():
            self.clock.jump(target)
        await self.settle()

    # ------------------------------------------------------------------ pods

    async def _create_pod(self, obj: JsonObj, *, t: float, gpus: int, high: bool, **extra: Any) -> SimPod:
        created = await self.store.create(Kind.POD, obj)
        meta = created["metadata"]
        self.seq += 1
        pod = SimPod(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            obj=created,
            gpus=gpus,
            high=high,
            created=t,
            seq=self.seq,
            **extra,
        )
        self.pods[pod.uid] = pod
        self.dirty = True
        return pod

    async def _create_job_pod(self, gpus: int, t: float, *, pinned: str | None, reclaim: bool) -> SimPod:
        obj = objects.pod(
            f"trainer-{self.seq + 1:06d}",
            JOB_NAMESPACE,
            gpus=gpus,
            priority=keys.PRIORITY_HIGH,
            owner=JOB_NAME,
            reliability=self.s.online_reliability,
            reclaim=reclaim,
            pin_nodes=(pinned,) if pinned else (),
            gpu_type=self.job_model,
        )
        return await self._create_pod(obj, t=t, gpus=gpus, high=True, reclaim=reclaim, pinned=pinned)

    def _newest_holding(self, gpus: int) -> tuple[list[SimPod], list[SimPod]]:
        """The job's bound pods, newest first, and the newest of them that together hold at
        least ``gpus`` GPUs (the pods a scale-down deletes; fewer when the job holds fewer)."""
        bound = sorted(
            (p for p in self._job_pods() if p.node), key=lambda p: (p.created, p.seq), reverse=True
        )
        chosen: list[SimPod] = []
        count = 0
        for pod in bound:
            if count >= gpus:
                break
            chosen.append(pod)
            count += pod.gpus
        return bound, chosen

    def _job_pods(self) -> list[SimPod]:
        return [p for p in self.pods.values() if p.high]

    def _job_devices(self) -> list[DeviceKey]:
        return [d for p in self._job_pods() for d in p.devices]

    def _release(self, pod: SimPod) -> None:
        for d in pod.devices:
            if self.held.get(d) == pod.uid:
                del self.held[d]
        self.pods.pop(pod.uid, None)
        self.dirty = True

    async def _delete_pod(self, pod: SimPod) -> None:
        """Delete ``pod`` and, as its node's kubelet (the simulated containers stop at once),
        confirm the deletion, so its GPUs are free."""
        with contextlib.suppress(NotFound):
            await self.store.delete(Kind.POD, pod.name, namespace=pod.namespace)
        await graceful.confirm_pod_deletion(self.store, pod.namespace, pod.name)
        self._release(pod)

    async def reconcile_pods(self, t: float) -> int:
        """Confirm the deletion of Terminating pods (evicted by the lease controller), as
        their kubelets would once the simulated containers stopped (at once), then drop pods
        the store no longer has; their LP jobs are resubmitted. Returns how many bound LP
        pods were found gone."""
        await self.caught_up()
        listed = list(self._listed_pods.items())  # what a list returns now, for both steps
        await graceful.confirm_listed(self.store, listed)  # each Terminating one is gone now
        present = {
            (o["metadata"]["namespace"], o["metadata"]["name"])
            for o in listed
            if not semantics.is_terminating(o)
        }
        gone = 0
        for pod in list(self.pods.values()):
            if pod.uid in self.pods and (pod.namespace, pod.name) not in present:
                if not pod.high and pod.node is not None:
                    gone += 1
                self._release(pod)
                if not pod.high:
                    await self._lp_pod_lost(pod, t)
        self.stats.evicted_by_controller += gone
        return gone

    # ------------------------------------------------------------------ scheduling

    async def _schedule_round(self, t: float, *, only_high: bool = False) -> None:
        """One scheduling round (:meth:`_schedule_pending`) with the lease controller held:
        its reconciles (tag releases, standby moves, reclaims) run once the round is over,
        not between HTTP calls at points that depend on timing."""
        async with self.host.paused():
            await self.settle()  # the extender's watches have seen every write so far
            await self._schedule_pending(t, only_high=only_high)
        await self.settle()

    async def _schedule_pending(self, t: float, *, only_high: bool = False) -> None:
        """One pass over the pending pods (``only_high``: the job's only), high priority first,
        then oldest; an LP job's pods are tried together as a gang (:meth:`_schedule_gang`).
        Within a round no capacity is freed, so after an LP gang of k GPUs does not fit,
        gangs of k or more GPUs are not tried again this round."""
        pending = sorted(
            (p for p in self.pods.values() if p.node is None and (p.high or not only_high)),
            key=lambda p: (not p.high, p.created, p.seq),
        )
        lp_floor: dict[str | None, int] = {}
        tried: set[int] = set()
        for pod in pending:
            if pod.uid not in self.pods or pod.node is not None:
                continue  # rolled back or bound with its gang meanwhile
            if pod.high:
                await self._schedule_high(pod, t)
                continue
            job = self.lp_jobs.get(pod.job if pod.job is not None else -1)
            if job is None or job.id in tried:
                continue
            tried.add(job.id)
            floor = lp_floor.get(job.model)
            if floor is not None and job.gpus >= floor:
                continue
            if not await self._schedule_gang(job, t):
                lp_floor[job.model] = job.gpus if floor is None else min(floor, job.gpus)

    async def _schedule_high(self, pod: SimPod, t: float) -> None:
        outcome = await self._schedule_one(pod, t)
        if outcome == "preempted":
            await self.settle()
            await self._schedule_one(pod, t, may_preempt=False)

    async def _schedule_gang(self, job: LpJob, t: float) -> bool:
        """Bind every pending pod of ``job``; when one does not fit, delete them all (the
        bound ones release their GPUs) and retry the job after its back-off. True when the
        whole gang runs."""
        for uid in list(job.pods):
            pod = self.pods.get(uid)
            if pod is None or pod.node is not None:
                continue
            if await self._schedule_one(pod, t) != "bound":
                await self._drop_gang(job)
                job.attempts += 1
                job.retry_at = t + min(self.s.lp_retry_max, self.s.lp_retry_base * 2 ** (job.attempts - 1))
                self.stats.lp_gang_rollbacks += 1
                return False
            await self.settle()
        job.started = t
        r = self.requests[job.request]
        if r.bound is None:
            self.requests[job.request] = metrics.LpRequest(r.arrival, r.gpus, t)
        return True

    async def _drop_gang(self, job: LpJob) -> None:
        for uid in job.pods:
            pod = self.pods.get(uid)
            if pod is not None:
                await self._delete_pod(pod)
        job.pods = []
        job.started = None

    def _may_preempt(self, pod: SimPod) -> bool:
        if not pod.high:
            return False
        # Right-of-return reclaim pods wait for the lease controller's graceful reclaim.
        return not (self.policy is Policy.ROR and pod.reclaim and not self.controller_missing)

    async def _schedule_one(self, pod: SimPod, t: float, *, may_preempt: bool = True) -> str:
        """filter → prioritize → bind (→ preempt). Returns ``bound``, ``preempted``,
        ``unschedulable`` or ``error``."""
        self.stats.scheduling_cycles += 1
        candidates = objects.affinity_nodes(pod.obj, self.candidates)
        try:
            result = await self.client.filter(pod.obj, candidates)
            passed = list(result.node_names or [])
            if not passed:
                self.stats.unschedulable += 1
                preempt = may_preempt and self._may_preempt(pod) and bool(result.failed_nodes)
                if preempt and await self._preempt(pod, result.failed_nodes, t):
                    return "preempted"
                self._ok()
                return "unschedulable"
            if len(passed) == 1:
                host = passed[0]  # kube-scheduler scores nothing when one node is feasible
            else:
                by_host = await self.client.prioritize(pod.obj, passed)
                best = max(by_host.get(n, 0) for n in passed)
                host = self.rng.choice(sorted(n for n in passed if by_host.get(n, 0) == best))
            error = await self.client.bind(pod.namespace, pod.name, uid=pod.uid, node=host)
        except ExtenderCallError as exc:
            self._error(f"{pod.namespace}/{pod.name}: {exc}")
            return "error"
        if error:
            self.stats.bind_errors += 1
            log.info("bind refused", extra=ctx(pod=f"{pod.namespace}/{pod.name}", node=host, error=error))
            self._ok()
            return "unschedulable"
        await self._confirm_bind(pod, host, t)
        self._ok()
        return "bound"

    def _ok(self) -> None:
        self.consecutive_errors = 0

    def _error(self, message: str) -> None:
        self.consecutive_errors += 1
        log.warning("extender call failed", extra=ctx(error=message))
        if self.consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
            raise SimulationError(f"{MAX_CONSECUTIVE_ERRORS} extender calls in a row failed; last: {message}")

    async def _confirm_bind(self, pod: SimPod, host: str, t: float) -> None:
        """Read back what bind wrote (``assigned-gpus``, ``spec.nodeName``), check it, mark
        the pod Running (the kubelet's part) and record it."""
        obj = await self.store.get(Kind.POD, pod.name, namespace=pod.namespace)
        raw = (obj["metadata"].get("annotations") or {}).get(keys.ANN_ASSIGNED_GPUS)
        node = (obj.get("spec") or {}).get("nodeName")
        try:
            assignment = Assignment.parse(str(raw)) if raw else None
        except PodSpecError:
            assignment = None
        if (
            assignment is None
            or assignment.node != host
            or node != host
            or len(assignment.indices) != pod.gpus
        ):
            self.stats.assignment_mismatches += 1
            self.invariants.violated(
                "assignment_mismatches",
                f"bind of {pod.namespace}/{pod.name} to {host}: assigned-gpus={raw!r} nodeName={node!r}",
            )
        devices = assignment.devices if assignment is not None else ()
        for d in devices:
            other = self.held.get(d)
            if other is not None and other != pod.uid and other in self.pods:
                await self._check_holder(self.pods[other], d, pod, t)
            self.held[d] = pod.uid
        pod.node = host
        pod.devices = devices
        pod.bound_at = t
        pod.obj = obj
        self.stats.bound["high" if pod.high else "low"] += 1
        await self._set_phase(pod, "Running")

    async def _check_holder(self, holder: SimPod, device: DeviceKey, new: SimPod, t: float) -> None:
        """``device`` was just bound to ``new`` while the driver still has ``holder`` on it:
        fine if the store no longer has ``holder`` (the lease controller evicted it since the
        driver last looked), a double allocation if it still holds the device."""
        try:
            obj = await self.store.get(Kind.POD, holder.name, namespace=holder.namespace)
        except NotFound:
            self._release(holder)
            self.stats.evicted_by_controller += int(not holder.high)
            if self.cycles:
                self.cycles[-1].lp_pods_evicted += int(not holder.high)
            if not holder.high:
                await self._lp_pod_lost(holder, t)
            return
        raw = (obj["metadata"].get("annotations") or {}).get(keys.ANN_ASSIGNED_GPUS)
        phase = (obj.get("status") or {}).get("phase")
        if raw and phase not in ("Succeeded", "Failed") and device in Assignment.parse(str(raw)).devices:
            self.stats.double_allocations += 1
            self.invariants.violated(
                "gpu_held_twice", f"{device} given to {new.name} while held by {holder.name}"
            )

    async def _set_phase(self, pod: SimPod, phase: str) -> None:
        with contextlib.suppress(NotFound):
            await self.store.patch(
                Kind.POD,
                pod.name,
                {"status": {"phase": phase}},
                namespace=pod.namespace,
                subresource="status",
            )

    async def _preempt(self, pod: SimPod, failed: dict[str, str], t: float) -> bool:
        """kube-scheduler's preemption: propose the LP pods on each failed node as victims,
        let ``/preempt`` narrow them, pick the node with the fewest PDB violations, then
        fewest victims, then fewest victim GPUs, and evict them. True when it evicted."""
        by_node: dict[str, list[SimPod]] = {}
        for p in self.pods.values():
            if not p.high and p.node in failed:
                by_node.setdefault(p.node, []).append(p)
        if not by_node:
            return False
        self.stats.preemption_attempts += 1
        kept = await self.client.preempt(pod.obj, {n: [p.uid for p in ps] for n, ps in by_node.items()})
        uid_to_pod = {p.uid: p for ps in by_node.values() for p in ps}
        options = []
        for node, victims in kept.items():
            vs = [uid_to_pod[v.uid] for v in victims.pods if v.uid in uid_to_pod]
            if len(vs) != len(victims.pods):
                self.stats.notes.append(f"/preempt named pods that were not proposed on {node}")
                continue
            options.append((victims.num_pdb_violations, len(vs), sum(v.gpus for v in vs), node, vs))
        if not options:
            return False
        options.sort(key=lambda o: o[:4])
        victims_on_node = options[0][4]
        for victim in victims_on_node:
            try:
                await self.store.evict(victim.namespace, victim.name)
                await graceful.confirm_pod_deletion(self.store, victim.namespace, victim.name)
            except NotFound:
                pass
            except TooManyRequests:
                self.stats.notes.append(f"eviction of {victim.name} refused by a PodDisruptionBudget")
                continue
            self._release(victim)
            await self._lp_pod_lost(victim, t)
            self.stats.preempted_lp_pods += 1
            if self.cycles and self.cycles[-1].up_at is not None and self.cycles[-1].restored_at is None:
                self.cycles[-1].lp_pods_preempted += 1
                if pod.reclaim:
                    self.cycles[-1].fallback_preemptions += 1
        return True

    # ------------------------------------------------------------------ node agents

    async def update_gpus(self, t: float) -> None:
        """Health and tiers at ``t``: refresh every tier when a refresh period has passed,
        otherwise downgrade GPUs in (or just out of) an outage; patch changed nodes. The
        audit observes first: a failure below takes GPUs from the job."""
        self.observe()
        changed: set[str] = set()
        refresh = tiering.is_refresh_due(self.last_refresh, t, self.tiers)
        if refresh:
            self.last_refresh = t
        lo = t - self.s.tick
        failed: list[DeviceKey] = []
        if self._sweep is None:
            self._sweep = failures.OutageSweep({k: g.outages for k, g in self.gpus.items()})
        # Only GPUs with an outage touching (lo, t], or unhealthy until now, can change
        # (a refresh recomputes all): the others are healthy, untouched and keep their tier.
        touched = self._sweep.touching(lo, t)
        if refresh:
            keys = list(self.gpus)
        elif self._unhealthy:
            order = self._gpu_order
            keys = sorted(set(touched) | self._unhealthy, key=order.__getitem__)
        else:
            keys = touched
        for key in keys:
            g = self.gpus[key]
            healthy = not failures.is_down(g.outages, t)
            hit = failures.downtime(g.outages, lo, t) > 0
            if hit:
                failed.append(key)
            if refresh:
                tier = tiering.refreshed(g.outages, t, self.tiers)
            elif not healthy or healthy != g.healthy or hit:
                tier = tiering.downgraded(g.tier, g.outages, t, self.tiers)
            else:
                tier = g.tier
            if healthy != g.healthy or tier.tier != g.tier.tier:
                changed.add(key.node)
            g.healthy = healthy
            g.tier = tier
            if healthy:
                self._unhealthy.discard(key)
            else:
                self._unhealthy.add(key)
        for node in sorted(changed):
            await self._patch_node_status(node, t)
        for key in failed:
            await self._kill_holder(key, t)

    async def _kill_holder(self, key: DeviceKey, t: float) -> None:
        """A GPU failed during the last tick: the process on it dies, so the pod holding it
        ends ``Failed`` and is deleted (its controller, the job's or the batch scheduler,
        replaces it)."""
        uid = self.held.get(key)
        pod = self.pods.get(uid or "")
        if pod is None:
            return
        await self._set_phase(pod, "Failed")
        await self._delete_pod(pod)
        if pod.high:
            self.stats.job_pods_killed += 1
            self._interrupt(t, reason=f"GPU {key} failed under {pod.name}")
        else:
            self.stats.lp_pods_killed += 1
            await self._lp_pod_lost(pod, t)

    # ------------------------------------------------------------------ LP workload

    async def lp_arrivals(self, t: float) -> None:
        """Submit the LP jobs arriving up to ``t`` (the trace's pods of one job, arriving
        together, form its gang; each job records one :class:`metrics.LpRequest`), and
        resubmit the jobs whose back-off is over."""
        arrivals = self.world.arrivals
        while self.arrival_idx < len(arrivals) and arrivals[self.arrival_idx].time <= t:
            first = arrivals[self.arrival_idx]
            sizes = []
            while (
                self.arrival_idx < len(arrivals)
                and arrivals[self.arrival_idx].job == first.job
                and arrivals[self.arrival_idx].time == first.time
            ):
                sizes.append(arrivals[self.arrival_idx].gpus)
                self.arrival_idx += 1
            self.requests.append(metrics.LpRequest(first.time, sum(sizes), None))
            job = LpJob(
                id=len(self.requests),
                sizes=tuple(sizes),
                remaining=first.duration,
                request=len(self.requests) - 1,
                submitted=first.time,
                model=self._lp_model(len(self.requests)),
            )
            self.lp_jobs[job.id] = job
            await self._submit(job, first.time)
        for job in list(self.lp_jobs.values()):
            if not job.pods and job.retry_at <= t:
                await self._submit(job, t)

    def _lp_model(self, job: int) -> str | None:
        """The model LP job ``job`` asks for: drawn by the shares (seeded per job)."""
        if not self.s.mixed:
            return None
        models = [m for m, _ in self.s.gpu_models]
        weights = [w for _, w in self.s.gpu_models]
        return random.Random(f"lp-model:{self.s.seed}:{job}").choices(models, weights)[0]

    async def _submit(self, job: LpJob, t: float) -> None:
        for size in job.sizes:
            obj = objects.pod(
                f"lp-{job.id:07d}-{self.seq + 1:07d}",
                LP_NAMESPACE,
                gpus=size,
                priority=keys.PRIORITY_LOW,
                owner=f"job-{job.id}",
                gpu_type=job.model,
            )
            pod = await self._create_pod(obj, t=t, gpus=size, high=False, job=job.id)
            job.pods.append(pod.uid)

    async def _lp_pod_lost(self, pod: SimPod, t: float) -> None:
        """One pod of an LP job is gone (evicted, preempted, killed with its GPU): the batch
        scheduler stops the rest of the gang and resubmits the job with the run time it has
        left; a job still waiting for its gang only retries."""
        job = self.lp_jobs.get(pod.job if pod.job is not None else -1)
        if job is None or pod.uid not in job.pods:
            return
        if job.started is not None:
            job.remaining = max(0.0, job.remaining - (t - job.started))
            job.resubmissions += 1
            self.stats.lp_resubmissions += 1
            job.attempts = 0
            job.retry_at = t
            job.submitted = t
        await self._drop_gang(job)

    async def lp_completions(self, t: float) -> None:
        """Finish the LP jobs whose run time is over (every pod Succeeded, then deleted) and
        withdraw those waiting longer than ``lp_max_wait`` since their (re)submission
        (their request stays unfulfilled if it never ran)."""
        for job in list(self.lp_jobs.values()):
            if job.started is not None and job.started + job.remaining <= t:
                for uid in job.pods:
                    pod = self.pods.get(uid)
                    if pod is not None:
                        await self._set_phase(pod, "Succeeded")
                        await self._delete_pod(pod)
                job.pods = []
                del self.lp_jobs[job.id]
                self.stats.completed_lp_jobs += 1
            elif job.started is None and t - job.submitted > self.s.lp_max_wait:
                await self._drop_gang(job)
                del self.lp_jobs[job.id]
                self.stats.withdrawn_lp_jobs += 1

    # ------------------------------------------------------------------ online job

    async def scale(self, t: float) -> None:
        """Apply the scale policy to the tide's demand at ``t``: scale down or up when it
        says so (never with :attr:`Policy.STATIC`); each scale event restarts the job."""
        if self.policy is Policy.STATIC:
            return
        if self.autopilot:
            await self.follow_policy(t)
            return
        target = tide.decide(self.size, self.world.tide.demand(t), self.policy_kind)
        if target is self.size:
            return
        self.size = target
        self._interrupt(t, reason=f"scale to {target.name}")
        if target is tide.Scale.HALF:
            await self._scale_down(t)
        else:
            self.job_target = self.s.job_gpus
            await self._scale_up(t)

    async def _scale_down(self, t: float) -> None:
        self.observe()  # the audit sees the job's GPUs before it gives half of them up
        bound, chosen = self._newest_holding(tide.released_count(self.s.job_gpus))
        devices = [d for p in chosen for d in p.devices]
        # what the job keeps: what it holds less what it releases (not its peak less that: a
        # GPU still owed to it by an open Reclaim is not one it holds, and it stays owed)
        self.job_target = sum(p.gpus for p in bound) - sum(p.gpus for p in chosen)
        for pod in self._job_pods():  # pending scale-up leftovers are dropped too
            if pod.node is None:
                await self._delete_pod(pod)
        for pod in chosen:
            await self._delete_pod(pod)
        cycle = metrics.Cycle(down_at=t, released=len(devices))
        cycle.notes.append(
            "released " + ",".join(str(d) for d in devices[:4]) + ("…" if len(devices) > 4 else "")
        )
        self.cycles.append(cycle)
        self.released = devices
        if self.policy is Policy.ROR and devices:
            name = f"lend-{len(self.cycles):04d}"
            lease = objects.gpulease(
                name,
                JOB_OWNER,
                action=LeaseAction.LEND,
                devices=devices,
                grace_period_seconds=self.s.grace_period_seconds,
            )
            started = self.now()
            await self.store.create(Kind.GPULEASE, lease)
            cycle.lend = f"{JOB_NAMESPACE}/{name}"
            final = await self._await_lease(name, self.s.lend_timeout)
            cycle.lend_s = self.now() - started
            cycle.lend_phase = _phase(final)
            status = (final or {}).get("status") or {}
            lent = status.get("lent") or []
            cycle.lent_in_kind = sum(1 for d in lent if d.get("inKind"))
            cycle.lent_tagged = len(lent) - cycle.lent_in_kind
            cycle.lent_untagged = len(devices) - len(lent)
            self.lend_lease = final
            if cycle.lend_phase != LeasePhase.DONE.value:
                cycle.notes.append(f"Lend ended {cycle.lend_phase}: {status.get('message', '')}")
        await self.settle()
        self.observe()

    # ------------------------------------------------------------------ autopilot mode

    def _policy_leases(self) -> list[tuple[str, GPULease]]:
        """The autopilot's GPULeases of the job not followed yet (label ``flexlease.io/policy``),
        in the order it wrote them (its sequence label)."""
        out: list[tuple[int, str, GPULease]] = []
        for key, lease in self._lease_objs.items():
            labels = lease.metadata.labels
            if key in self._adopted or lease.spec.owner != JOB_OWNER or keys.LABEL_POLICY not in labels:
                continue
            raw = labels.get(keys.LABEL_POLICY_SEQUENCE, "")
            out.append((int(raw) if raw.isdigit() else 0, key, lease))
        return [(key, lease) for _, key, lease in sorted(out, key=lambda x: (x[0], x[1]))]

    async def follow_policy(self, t: float) -> None:
        """The job's controller under the autopilot: follow each GPULease the autopilot wrote
        since the last tick, oldest first. A Lend of N (once the lease controller recorded the
        GPUs the pods hold: its baseline) deletes the newest pods holding at least N GPUs and
        keeps ``held - N``; a Reclaim of N raises the job's size by N and follows the Reclaim
        as the tide policy's scale-up does (pinned pods on the returned GPUs). Each is one
        restart of the job. A lease that Failed before the job acted is only noted."""
        if self.reclaim_started is not None:
            # an open Reclaim may wait for the job's pods with no deadline of the controller's
            # to follow it at (its targets free): the job's controller looks every tick
            await self._follow_reclaim(t)
        await self.caught_up()
        for key, lease in self._policy_leases():
            name = key.split("/", 1)[1]
            phase = lease.status.phase
            if phase is LeasePhase.FAILED:
                self._adopted.add(key)
                self.stats.notes.append(f"autopilot GPULease {key} Failed: {lease.status.message}")
                continue
            if lease.spec.action is LeaseAction.LEND:
                if keys.ANN_LEND_BASELINE not in lease.metadata.annotations and phase is not LeasePhase.DONE:
                    return  # the lease controller has not recorded the baseline yet: next tick
                self._adopted.add(key)
                await self._lend_for_policy(name, lease.spec.count or 0, t)
            else:
                if self.reclaim_started is not None:
                    return  # one Reclaim followed at a time (the autopilot writes one at a time too)
                self._adopted.add(key)
                await self._reclaim_for_policy(name, lease.spec.count or 0, t)

    async def _lend_for_policy(self, name: str, count: int, t: float) -> None:
        self.observe()
        held = sum(p.gpus for p in self._job_pods() if p.node)
        count = min(count, held)
        _bound, chosen = self._newest_holding(count)
        self.job_target = held - count
        self.size = tide.Scale.FULL if self.job_target >= self.s.job_gpus else tide.Scale.HALF
        self._interrupt(t, reason=f"lend {count} GPUs ({name})")
        self.demand.lends += 1
        self.demand.lent_by_policy += count
        for pod in self._job_pods():  # pending pods are dropped: the job shrinks
            if pod.node is None:
                await self._delete_pod(pod)
        devices = [d for p in chosen for d in p.devices]
        for pod in chosen:
            await self._delete_pod(pod)
        cycle = metrics.Cycle(down_at=t, released=count)
        cycle.lend = f"{JOB_NAMESPACE}/{name}"
        cycle.notes.append(f"autopilot Lend of {count}: released {len(devices)} GPUs in {len(chosen)} pods")
        self.cycles.append(cycle)
        self.released = devices
        started = self.now()
        final = await self._await_lease(name, self.s.lend_timeout)
        cycle.lend_s = self.now() - started
        cycle.lend_phase = _phase(final)
        status = (final or {}).get("status") or {}
        lent = status.get("lent") or []
        cycle.lent_in_kind = sum(1 for d in lent if d.get("inKind"))
        cycle.lent_tagged = len(lent) - cycle.lent_in_kind
        cycle.lent_untagged = count - len(lent)
        if cycle.lend_phase != LeasePhase.DONE.value:
            cycle.notes.append(f"Lend ended {cycle.lend_phase}: {status.get('message', '')}")
        await self._fill_job(t)  # what the pods released beyond the count: a smaller pod
        await self.settle()
        await self._schedule_round(t)
        self.observe()

    async def _reclaim_for_policy(self, name: str, count: int, t: float) -> None:
        cycle = self.cycles[-1] if self.cycles and self.cycles[-1].up_at is None else metrics.Cycle(t, 0)
        if cycle not in self.cycles:
            self.cycles.append(cycle)
        cycle.up_at = t
        held = sum(len(p.devices) for p in self._job_pods())
        self.job_target = max(self.job_target, min(self.s.job_gpus, held + count))
        self.size = tide.Scale.FULL if self.job_target >= self.s.job_gpus else tide.Scale.HALF
        self._interrupt(t, reason=f"reclaim {count} GPUs ({name})")
        self.demand.reclaims += 1
        self.demand.reclaimed_by_policy += count
        self.observe()
        for pod in self._job_pods():  # pending pods that take any GPU: pinned ones replace them
            if pod.node is None and not pod.reclaim:
                await self._delete_pod(pod)
        cycle.reclaim = f"{JOB_NAMESPACE}/{name}"
        self.reclaim_name = name
        self.reclaim_started = t
        await self._follow_reclaim(t)
        await self._fill_job(t)
        await self.settle()
        await self._schedule_round(t)
        self._note_back(cycle)
        self.observe()

    def account_demand(self, t: float) -> None:
        """Add the tick ending at ``t`` to :attr:`demand` (after the warm-up): the job's GPUs
        against the trace's demand at ``t``, and the GPUs tagged for it."""
        if t <= self.s.warmup:
            return
        tick = self.s.tick
        need = self.world.tide.needed(t)
        have = len(self._job_devices())
        d = self.demand
        d.seconds += tick
        d.held_gpu_s += have * tick
        if have < need:
            d.below_s += tick
            d.below_gpu_s += (need - have) * tick
        else:
            d.above_gpu_s += (have - need) * tick
        d.lent_gpu_s += sum(1 for owner in self._tags.values() if owner == JOB_OWNER) * tick

    def demand_report(self) -> dict[str, Any]:
        """The ``demand`` section: who sized the job and how well it met the trace's demand."""
        d = self.demand
        return {
            "sizing": f"autopilot:{self.s.autopilot}" if self.autopilot else "tide policy (§4.4)",
            "lead_time_s": self.s.autopilot_lead if self.autopilot else None,
            "hours": round(d.seconds / 3600, 3),
            "below_share": round(d.below_s / d.seconds, 6) if d.seconds else None,
            "below_gpu_hours": round(d.below_gpu_s / 3600, 3),
            "above_gpu_hours": round(d.above_gpu_s / 3600, 3),
            "held_gpu_hours": round(d.held_gpu_s / 3600, 3),
            "lent_gpu_hours": round(d.lent_gpu_s / 3600, 3),
            "policy_lends": d.lends,
            "policy_reclaims": d.reclaims,
            "policy_lent_gpus": d.lent_by_policy,
            "policy_reclaimed_gpus": d.reclaimed_by_policy,
        }

    async def _await_lease(self, name: str, limit_s: float) -> JsonObj | None:
        """Settle, then step the clock through the extender's deadlines until the lease is
        Done/Failed or ``limit_s`` simulated seconds have passed; returns the last object seen
        (None if it vanished). A lease still Pending after settling: the controller is
        missing (noted once, never waited for again)."""
        limit = self.clock.now() + (0.0 if self.controller_missing else limit_s)
        while True:
            await self.settle()
            try:
                obj = await self.store.get(Kind.GPULEASE, name, namespace=JOB_NAMESPACE)
            except NotFound:
                return None
            phase = _phase(obj)
            if phase in FINAL_PHASE_VALUES:
                return obj
            due = self.clock.next_due()
            if phase == LeasePhase.PENDING.value or due is None or due > limit:
                self._controller_timeout(name, obj)
                return obj
            self.clock.jump(max(due, self.clock.now()))

    def _controller_timeout(self, name: str, obj: JsonObj | None) -> None:
        self.stats.controller_timeouts += 1
        if not self.controller_missing:
            self.controller_missing = _phase(obj) in (None, LeasePhase.PENDING.value)
            self.stats.notes.append(
                f"GPULease {name} still {_phase(obj)!r} after its wait: "
                + (
                    "the lease controller does not seem to run in the extender"
                    if self.controller_missing
                    else f"status: {((obj or {}).get('status') or {}).get('message', '')}"
                )
            )

    async def _scale_up(self, t: float) -> None:
        cycle = self.cycles[-1] if self.cycles and self.cycles[-1].up_at is None else metrics.Cycle(t, 0)
        cycle.up_at = t
        self.reclaim_name = None
        self.reclaim_started = None
        if self.policy is Policy.ROR:
            self.observe()
            lent = ((self.lend_lease or {}).get("status") or {}).get("lent") or []
            if lent or self.audit.open_loans(JOB_OWNER):
                # §4.4: "during each scale-up, all loaned GPUs were reclaimed" (a count above
                # what is out on loan takes everything, carried-over loans included)
                await self._reclaim(cycle, self.s.job_gpus, t)
        await self._fill_job(t)
        await self.settle()
        await self._schedule_round(t)
        self._note_back(cycle)
        self.observe()

    async def _reclaim(self, cycle: metrics.Cycle, count: int, t: float) -> None:
        """Write the Reclaim and follow it at once; :meth:`advance_to` follows it up at each
        of the controller's deadlines until it is Done, Failed or Cancelled."""
        name = f"reclaim-{len(self.cycles):04d}"
        lease = objects.gpulease(
            name,
            JOB_OWNER,
            action=LeaseAction.RECLAIM,
            count=count,
            grace_period_seconds=self.s.grace_period_seconds,
        )
        await self.store.create(Kind.GPULEASE, lease)
        cycle.reclaim = f"{JOB_NAMESPACE}/{name}"
        self.reclaim_name = name
        self.reclaim_started = t
        await self._follow_reclaim(t)

    async def _follow_reclaim(self, t: float) -> None:
        """Look at the open Reclaim: drop the pods the controller evicted, keep the pinned
        reclaim pods in line with the job's tags and schedule them; once it is final (or the
        controller is missing), record its outcome on its cycle (the audit accounts it)."""
        assert self.reclaim_name is not None and self.reclaim_started is not None
        key = f"{JOB_NAMESPACE}/{self.reclaim_name}"
        cycle = next((c for c in reversed(self.cycles) if c.reclaim == key), None)
        await self.settle()
        evicted = await self.reconcile_pods(t)
        if cycle is not None:
            cycle.lp_pods_evicted += evicted
        obj = await self._reclaim_lease()
        phase = _phase(obj)
        if phase in (LeasePhase.IN_PROGRESS.value, LeasePhase.DONE.value):
            await self._pin_reclaim_pods(t)
            await self.settle()
            await self._schedule_round(t, only_high=True)
            await self.settle()  # the controller sees the binds (and may finish the lease)
            obj = await self._reclaim_lease()
            phase = _phase(obj)
        self.observe()
        if phase == LeasePhase.IN_PROGRESS.value:
            return
        status = (obj or {}).get("status") or {}
        if phase == LeasePhase.PENDING.value or phase is None:
            self._controller_timeout(self.reclaim_name, obj)
        if cycle is not None:
            cycle.reclaim_phase = phase
            cycle.reclaim_s = t - self.reclaim_started
            self._note_back(cycle)
            await self._check_supplements(cycle, key, status)
            if phase != LeasePhase.DONE.value:
                cycle.notes.append(f"Reclaim ended {phase}: {status.get('message', '')}")
        self.reclaim_started = None  # closed: the pods bound from here on are accounted

    async def _check_supplements(self, cycle: metrics.Cycle, key: str, status: JsonObj) -> None:
        """A finished Reclaim's standby supplements: each of the simulated hardware's model of
        the GPU it replaces, each announced by a ``Supplemented`` Event."""
        supplements = [
            (
                DeviceKey(s["original"]["node"], int(s["original"]["index"])),
                DeviceKey(s["replacement"]["node"], int(s["replacement"]["index"])),
            )
            for s in status.get("supplementedFromStandby") or []
        ]
        cycle.supplements_listed = len(supplements)
        models = self.world.gpu_models
        cycle.supplement_model_mismatches = [
            f"{original} supplemented by {replacement}"
            for original, replacement in supplements
            if models.get(original.node) != models.get(replacement.node)
        ]
        for detail in cycle.supplement_model_mismatches:
            self.invariants.violated("supplement_model_mismatch", detail)
        cycle.supplement_events = await self._supplement_events(key.split("/", 1)[1])
        if cycle.supplement_events < cycle.supplements_listed:
            self.invariants.violated(
                "reclaim_events_missing",
                f"{key}: {cycle.supplements_listed} standby supplements listed,"
                f" {cycle.supplement_events} Supplemented Events",
            )

    async def _supplement_events(self, lease: str) -> int:
        """``Supplemented`` Events the lease controller wrote about GPULease ``lease``."""
        events = (await self.store.list(Kind.EVENT, namespace=JOB_NAMESPACE)).items
        return sum(
            1
            for e in events
            if e.get("reason") == "Supplemented"
            and (e.get("involvedObject") or {}).get("kind") == keys.GPULEASE_KIND
            and (e.get("involvedObject") or {}).get("name") == lease
        )

    async def _reclaim_lease(self) -> JsonObj | None:
        assert self.reclaim_name is not None
        try:
            return await self.store.get(Kind.GPULEASE, self.reclaim_name, namespace=JOB_NAMESPACE)
        except NotFound:
            return None

    async def _owner_tags(self) -> dict[str, list[int]]:
        """GPUs tagged for the job that are free and healthy, by node: what its reclaim pods can
        take now (a tagged GPU an LP pod still holds waits for the eviction, a failed one for
        the Reclaim's standby replacement; a pod sized to those would take other GPUs)."""
        await self.caught_up()
        out: dict[str, list[int]] = {}
        for key, owner in sorted(self._tags.items()):
            if owner != JOB_OWNER or self.held.get(key, "") in self.pods:
                continue
            state = self.gpus.get(key)
            if state is not None and state.healthy:
                out.setdefault(key.node, []).append(key.index)
        return out

    async def _pin_reclaim_pods(self, t: float) -> None:
        """Keep one pending reclaim pod per node, pinned there, sized to the job's free tagged
        GPUs there, never beyond the job's size (``job_target``)."""
        free = await self._owner_tags()
        if self.autopilot:  # a Reclaim of the autopilot takes some loans back, not every one
            targets = self._reclaim_targets()
            free = {n: [i for i in ix if DeviceKey(n, i) in targets] for n, ix in free.items()}
        wanted = {n: len(ix) for n, ix in free.items() if ix}
        for pod in [p for p in self._job_pods() if p.node is None and p.reclaim]:
            if pod.pinned is None or wanted.get(pod.pinned) != pod.gpus:
                await self._delete_pod(pod)
            else:
                wanted.pop(pod.pinned)
        pods = sum(p.gpus for p in self._job_pods())
        room = self.job_target - pods + self._loans_held()
        if self.autopilot:
            # a target free beside a job at its size (a pod of it took another GPU of the
            # node): the job takes the target too, up to its peak; the autopilot lends the
            # surplus once the Reclaim is done
            room = min(self.s.job_gpus - pods, max(room, sum(wanted.values())))
        for node, n in sorted(wanted.items()):
            for size in traces.split_pods(n, self.s.gpus_per_node):
                if size > room:
                    return
                await self._create_job_pod(size, t, pinned=node, reclaim=True)
                room -= size

    def _reclaim_reserved(self) -> int:
        """GPUs the open Reclaim still brings back to the job that no pod of the job holds or
        waits for pinned: its targets (or their replacements) not back and not unrecoverable
        (while it is Pending: the job's open loans). The job's controller leaves room for them
        instead of filling it with GPUs from anywhere."""
        if self.reclaim_name is None:
            return 0
        lease = self._lease_objs.get(f"{JOB_NAMESPACE}/{self.reclaim_name}")
        if lease is None or lease.status.phase in FINAL_PHASES:
            return 0
        status = lease.status
        if status.phase is LeasePhase.PENDING:
            due = len(self.audit.open_loans(JOB_OWNER))
        else:
            held = set(self._job_devices())
            back = {d.key for d in status.reclaimed} | {u.key for u in status.unrecoverable}
            current = {
                s.original.key: (s.replacement.key, bool(s.returned))
                for s in status.supplemented_from_standby
            }
            due = 0
            for target in status.lent:
                device, returned = current.get(target.key, (target.key, False))
                if target.key not in back and not returned and device not in held:
                    due += 1
        pinned = sum(p.gpus for p in self._job_pods() if p.node is None and p.reclaim)
        return max(0, due - pinned)

    async def _fill_job(self, t: float) -> None:
        """The job's controller: create pods for the rest of its current size
        (``job_target``): at full size with right-of-return, pinned reclaim pods for the free
        GPUs tagged for it, room for what the open Reclaim still brings back, then unpinned
        pods of whole nodes for the remainder."""
        reserved = 0
        if self._pins_reclaim_pods():
            await self._pin_reclaim_pods(t)
            reserved = self._reclaim_reserved()
        have = sum(p.gpus for p in self._job_pods())
        missing = self.job_target - have - reserved
        if missing > 0:
            for size in traces.split_pods(missing, self.job_pod_gpus):
                await self._create_job_pod(size, t, pinned=None, reclaim=False)

    def _pins_reclaim_pods(self) -> bool:
        """Whether the job's controller pins pods to the GPUs tagged for it: under the tide
        policy at full size with right-of-return, under the autopilot while a Reclaim is open."""
        if self.autopilot:
            return self.reclaim_started is not None
        return self.policy is Policy.ROR and self.size is tide.Scale.FULL

    def _interrupt(self, t: float, *, reason: str) -> None:
        """The job restarts: in situ with right-of-return (the paper's pipeline), a full
        restart otherwise; the cost is counted as interruption time."""
        cost = self.s.restart_in_situ_s if self.policy is Policy.ROR else self.s.restart_full_s
        self.stats.job_restarts += 1
        self.stats.job_interruption_s += cost
        log.debug("job restart", extra=ctx(t=t, reason=reason, seconds=cost))

    def _note_back(self, cycle: metrics.Cycle) -> None:
        """How many of the GPUs the cycle's scale-down released the job holds again."""
        held = set(self._job_devices())
        cycle.same_devices_back = sum(1 for d in self.released if d in held)

    async def check_restored(self, t: float) -> None:
        """Mark the current cycle restored once the job holds its full size again."""
        if not self.cycles:
            return
        c = self.cycles[-1]
        full = self.job_target if self.autopilot else self.s.job_gpus
        restored = sum(len(p.devices) for p in self._job_pods()) >= full
        if c.up_at is not None and c.restored_at is None and restored:
            c.restored_at = t
            self._note_back(c)

    # ------------------------------------------------------------------ metrics

    def sample(self, t: float) -> None:
        """Record the hourly :class:`metrics.Sample` at ``t``."""
        self._note_static_set()
        job = self._job_devices()
        ha = sum(1 for d in job if self.gpus[d].tier.tier is Tier.HA)
        standby = {n for n, pool in self.pools.items() if pool is Pool.STANDBY}
        general = [k for k in self.gpus if k.node not in standby]
        cluster_ha = sum(1 for k in general if self.gpus[k].tier.tier is Tier.HA) / max(1, len(general))
        static_ha = sum(1 for d in self.static_set if self.gpus[d].tier.tier is Tier.HA) / max(
            1, len(self.static_set)
        )
        self.samples.append(
            metrics.Sample(
                t=t,
                job_gpus=len(job),
                job_ha=ha,
                cluster_ha_share=cluster_ha,
                full=self.size is tide.Scale.FULL and len(job) >= self.s.job_gpus,
                job_standby_gpus=sum(1 for d in job if d.node in standby),
                standby_in_use=sum(1 for d in self.held if d.node in standby),
                lp_running_gpus=sum(p.gpus for p in self.pods.values() if not p.high and p.node),
                static_ha_share=static_ha,
                standby_idle=sum(
                    1
                    for k, g in self.gpus.items()
                    if k.node in standby and g.healthy and k not in self.held and k not in self._tags
                ),
            )
        )

    # ------------------------------------------------------------------ main loop

    async def check_invariants(self, t: float, *, full: bool = True) -> None:
        """Check every :class:`Invariants` item and count each violation: pools from the
        store's GPUNodes; holdings from every live pod's ``assigned-gpus`` in the store
        (``full``; hourly) or from the pods the driver runs, as it read them back after bind
        (every tick)."""
        inv = self.invariants
        inv.checks += 1
        job = sum(len(p.devices) for p in self._job_pods())
        if job > self.s.job_gpus:
            inv.violated("job_above_peak", f"t={t:g}: the job holds {job} GPUs, peak {self.s.job_gpus}")
        if full:  # the pools and the pods below as of one instant
            await self.caught_up()
        self.pools = dict(self._watched_pools)
        standby_nodes = {n for n, pool in self.pools.items() if pool is Pool.STANDBY}
        holdings: list[tuple[str | SimPod, bool, tuple[DeviceKey, ...]]] = []
        if full:  # every live pod in the store, by its assigned-gpus annotation
            for obj in self._listed_pods.items():
                meta = obj["metadata"]
                raw = (meta.get("annotations") or {}).get(keys.ANN_ASSIGNED_GPUS)
                if not raw or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                try:
                    devices = Assignment.parse(str(raw)).devices
                except PodSpecError:
                    continue
                labels = meta.get("labels") or {}
                high = labels.get(keys.LABEL_PRIORITY) == keys.PRIORITY_HIGH
                holdings.append((f"{meta['namespace']}/{meta['name']}", high, devices))
        else:  # the pods the simulator runs, with the assignment it read back after bind
            holdings = [(p, p.high, p.devices) for p in self.pods.values() if p.node]
        holders: dict[DeviceKey, str | SimPod] = {}
        for holder, high, devices in holdings:
            for d in devices:
                if d in holders:
                    inv.violated(
                        "gpu_held_twice", f"t={t:g}: {d} held by {_named(holders[d])} and {_named(holder)}"
                    )
                holders[d] = holder
                if not high and d.node in standby_nodes:
                    inv.violated("lp_on_standby", f"t={t:g}: {_named(holder)} holds {d} on a standby node")
        if self.autopilot and self.reclaim_started is not None:
            self._check_job_takes_its_gpus(t, among=self._reclaim_targets(), substitutes=self._substitutes())
        elif self.policy is Policy.ROR and self.size is tide.Scale.FULL:
            self._check_job_takes_its_gpus(t)
        self.observe()

    def _substitutes(self) -> int:
        """GPUs the open Reclaim's pinned pods hold that are not its targets. The lease controller
        picks a count Reclaim's targets among the job's loans cheapest first; the extender binds
        a reclaim pod to the owner's tagged GPUs of the lowest tier first. On a node with loans
        besides the targets a pinned pod may take one of those: the job took a GPU of its own,
        not an untagged one, and the next pinned pod goes for the target (:meth:`_pin_reclaim_pods`
        makes room for it). Only the open Reclaim's pods count (created since it started)."""
        if self.reclaim_started is None:
            return 0
        targets = self._reclaim_targets()
        return sum(
            1
            for p in self._job_pods()
            if p.reclaim and p.created >= self.reclaim_started
            for d in p.devices
            if d not in targets
        )

    def _loans_held(self) -> int:
        """Under the autopilot, GPUs the job's pods hold that are still tagged for it and are
        not the open Reclaim's targets: loans a pod of the job took on its own (a pod replacing
        one lost to a GPU failure may take any GPU tagged for its owner). They do not count
        against the job's size while a Reclaim waits for its targets, or the job would sit at
        its size beside a target it never takes; the autopilot lends the surplus later."""
        if not self.autopilot or self.reclaim_started is None:
            return 0
        targets = self._reclaim_targets()
        return sum(1 for d in self._job_devices() if self._tags.get(d) == JOB_OWNER and d not in targets)

    def _reclaim_targets(self) -> frozenset[DeviceKey]:
        """The GPUs the open Reclaim of the autopilot takes back (its ``status.lent``, and the
        standby replacements of those it supplemented): under the autopilot a Reclaim may take
        fewer GPUs than are lent, and only these are what the job's pinned pods are for and
        what must not sit idle beside a job at its size."""
        if self.reclaim_name is None:
            return frozenset()
        lease = self._lease_objs.get(f"{JOB_NAMESPACE}/{self.reclaim_name}")
        if lease is None:
            return frozenset()
        status = lease.status
        return frozenset(d.key for d in status.lent) | {
            s.replacement.key for s in status.supplemented_from_standby
        }

    def _check_job_takes_its_gpus(
        self, t: float, *, among: frozenset[DeviceKey] | None = None, substitutes: int = 0
    ) -> None:
        """At full size the job must hold the GPUs tagged for it: a healthy, free GPU tagged for
        the job while it holds its full size means its pods took other GPUs instead. ``among``:
        only these GPUs (the autopilot's open Reclaim's targets); ``substitutes``: that many
        idle ones are excused (see :meth:`_substitutes`)."""
        if sum(len(p.devices) for p in self._job_pods()) - self._loans_held() < self.job_target:
            return
        idle = [
            key
            for key, owner in self._tags.items()
            if owner == JOB_OWNER
            and key not in self.held
            and key in self.gpus
            and self.gpus[key].healthy
            and (among is None or key in among)
        ]
        if len(idle) > substitutes:
            self.invariants.violated(
                "job_full_beside_lent_gpus",
                f"t={t:g}: the job holds its {self.job_target} GPUs while {len(idle)} GPUs tagged for it"
                f" are free: {', '.join(str(k) for k in sorted(idle)[:4])}",
            )

    async def _gpunode_event(self, event: WatchEvent) -> None:
        name = str(event.object["metadata"]["name"])
        for key in self._node_tags.pop(name, ()):
            self._tags.pop(key, None)
        if event.type is EventType.DELETED:
            self._watched_pools.pop(name, None)
            return
        spec = event.object.get("spec") or {}
        self._watched_pools[name] = Pool(spec.get("pool") or Pool.GENERAL.value)
        tagged: list[DeviceKey] = []
        for index, device in (spec.get("devices") or {}).items():
            owner = (device or {}).get("owner")
            if owner:
                key = DeviceKey(name, int(index))
                self._tags[key] = str(owner)
                tagged.append(key)
        if tagged:
            self._node_tags[name] = tuple(tagged)

    async def _lease_event(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        if event.type is EventType.DELETED:
            self._lease_objs.pop(key, None)
            return
        try:
            self._lease_objs[key] = resources.parse_gpulease(event.object)
        except ValidationError:
            self._lease_objs.pop(key, None)  # the lease controller fails it; nothing to audit

    def _owner_of(self, pod: SimPod) -> str:
        """The owner ``<ns>/<job>`` of a pod the simulator runs (MATCH(Pod, Owner))."""
        return JOB_OWNER if pod.high else f"{LP_NAMESPACE}/job-{pod.job}"

    def observe(self) -> None:
        """Show the right-of-return audit the leases, tags and the pods' GPUs as they are now
        (after a settle: every watch delivered) and count what it finds; then close the cycles
        whose Reclaim finished (:meth:`_close_cycles`). Called after every step that may have
        let the lease controller act, before the simulator takes GPUs from the job."""
        if self.policy is not Policy.ROR:
            return
        pods = self.pods
        holders = {d: self._owner_of(pods[uid]) for d, uid in self.held.items() if uid in pods}
        found = self.audit.observe(
            self._lease_objs.values(), tags=self._tags, holders=holders, nodes=self._watched_pools.keys()
        )
        for violation in found:
            self.invariants.violated(violation.invariant, violation.detail)
        self._close_cycles()

    def _close_cycles(self) -> None:
        """Account every scaled-up cycle whose Reclaim the audit saw finish, from its tallies
        (device identities): see :class:`metrics.Cycle`. A cycle whose lent GPUs do not all end
        as exactly one outcome is a ``cycle_unaccounted`` violation."""
        for c in self.cycles:
            if c.closed or c.reclaim is None or not self.audit.finished(c.reclaim):
                continue
            c.closed = True
            rec = self.audit.tally(c.reclaim)
            lend = self.audit.tally(c.lend) if c.lend is not None else rightofreturn.Tally()
            c.carried_in = rec.carried_in
            c.returned_before_reclaim = lend.returned_early
            c.reclaimed_same = rec.back
            c.supplemented = rec.replaced
            c.unrecoverable = rec.unrecoverable
            c.unrecoverable_reasons = dict(sorted(rec.unrecoverable_reasons.items()))
            c.still_lent = rec.still_lent
            from_lend = lend.claimed_by.get(c.reclaim, 0)
            c.earlier_loans = rec.lent - from_lend - rec.carried_in
            # under the autopilot, loans of its Lend its Reclaim left out (still out, or claimed
            # since by a later one); the tide policy's Reclaims take every loan: none is left
            c.left_on_loan = (
                sum(1 for loan in self.audit.open_loans(JOB_OWNER) if loan.lease == c.lend)
                + sum(n for name, n in lend.claimed_by.items() if name != c.reclaim)
                if c.lend is not None and self.autopilot
                else 0
            )
            c.lost = max(0, lend.lent - lend.returned_early - from_lend - c.left_on_loan) + (
                rec.lent - rec.resolved
            )
            if c.lost or c.balance():
                self.invariants.violated(
                    "cycle_unaccounted",
                    f"cycle {c.lend}/{c.reclaim}: lent {c.lent} + carried in {c.carried_in}"
                    f" + earlier loans {c.earlier_loans} = before the reclaim"
                    f" {c.returned_before_reclaim} + back {c.reclaimed_same} + replaced {c.supplemented}"
                    f" + unrecoverable {c.unrecoverable} + still lent {c.still_lent}, lost {c.lost}"
                    f" (the Reclaim took {rec.lent} targets, {from_lend} of them lent by its Lend)",
                )

    async def run(self) -> None:
        """Set up, then tick until the horizon. Raises :class:`SimulationError` when the
        extender or the store keeps failing."""
        async with self._gpunodes.running(), self._listed_pods.running(), self._leases.running():
            await self._gpunodes.listed.wait()
            await self._listed_pods.listed.wait()
            await self._leases.listed.wait()
            await self._run()

    async def _run(self) -> None:
        self.wall_started = time.perf_counter()
        self.cpu_started = time.process_time()
        try:
            await self.setup()
            await self.check_invariants(0.0)
            self.sample(0.0)
            ticks = int(self.s.horizon // self.s.tick)
            for k in range(1, ticks + 1):
                t = k * self.s.tick
                await self.advance_to(t)
                await self.update_gpus(t)
                await self.lp_completions(t)
                await self.scale(t)
                await self.lp_arrivals(t)
                if t % 3600 == 0:
                    await self.reconcile_pods(t)
                if sum(p.gpus for p in self._job_pods()) < self.job_target:
                    await self._fill_job(t)  # the job's controller replaces what it lost
                if self.dirty or any(p.node is None for p in self.pods.values()):
                    self.dirty = False
                    await self._schedule_round(t)
                await self.check_restored(t)
                await self.check_invariants(t, full=t % 3600 == 0)
                self.account_demand(t)
                if t % 3600 == 0:
                    self.sample(t)
                if k % (ticks // 20 or 1) == 0:
                    log.info(
                        "simulation progress",
                        extra=ctx(
                            policy=self.policy.value,
                            day=round(t / traces.DAY, 2),
                            pods=len(self.pods),
                            wall_s=round(time.perf_counter() - self.wall_started, 1),
                        ),
                    )
            self.observe()
        except StoreError as exc:
            raise SimulationError(f"store failed: {exc}") from exc
        finally:
            self.wall_s = time.perf_counter() - self.wall_started
            self.cpu_s = time.process_time() - self.cpu_started

    def timing(self) -> dict[str, Any]:
        """Wall-clock and CPU figures of the run (not part of the reproducible report)."""
        return {
            "wall_s": round(self.wall_s, 1),
            "cpu_s": round(self.cpu_s, 1),
            "settles": self.stats.settles,
            "http": self.client.stats.as_dict(),
        }

    def report(self) -> dict[str, Any]:
        """The policy's section of the JSON report."""
        s = self.s
        since = s.warmup
        return {
            "policy": self.policy.value,
            "invariants": self.invariants.as_dict(),
            "ha_share": metrics.ha_share_summary(self.samples),
            "job": {
                "restarts": self.stats.job_restarts,
                "interruption_hours": round(self.stats.job_interruption_s / 3600, 3),
                "pods_killed_by_gpu_failures": self.stats.job_pods_killed,
            },
            "lp_fulfilment": {
                "overall": metrics.overall_fulfilment(self.requests, patience=s.lp_patience, since=since),
                "trough_00_06": metrics.overall_fulfilment(
                    self.requests, patience=s.lp_patience, since=since, hours=range(6)
                ),
                "rest_06_24": metrics.overall_fulfilment(
                    self.requests, patience=s.lp_patience, since=since, hours=range(6, 24)
                ),
                "by_hour_of_day": metrics.fulfilment_by_hour(
                    self.requests, patience=s.lp_patience, since=since
                ),
                "requests": sum(1 for r in self.requests if r.arrival >= since),
                "days": round((s.horizon - since) / traces.DAY, 4),
                "requested_gpus_by_hour": metrics.gpus_by_hour(
                    self.requests, patience=s.lp_patience, since=since
                )[0],
                "granted_gpus_by_hour": metrics.gpus_by_hour(
                    self.requests, patience=s.lp_patience, since=since
                )[1],
            },
            "reclaim": metrics.cycle_summary(self.cycles),
            "demand": self.demand_report(),
            "standby": {
                "max_job_standby_gpus": max((x.job_standby_gpus for x in self.samples), default=0),
                "max_standby_in_use": max((x.standby_in_use for x in self.samples), default=0),
                "final_job_standby_gpus": self.samples[-1].job_standby_gpus if self.samples else 0,
                "mode": s.standby_mode,
                # hourly samples: each counts one hour of its idle standby GPUs
                "idle_gpu_hours": sum(x.standby_idle for x in self.samples if x.t >= since),
                "final_idle_gpus": self.samples[-1].standby_idle if self.samples else 0,
            },
            "scheduling": {
                "cycles": self.stats.scheduling_cycles,
                "bound_high": self.stats.bound["high"],
                "bound_low": self.stats.bound["low"],
                "unschedulable": self.stats.unschedulable,
                "bind_errors": self.stats.bind_errors,
                "preemption_attempts": self.stats.preemption_attempts,
                "preempted_lp_pods": self.stats.preempted_lp_pods,
                "lp_pods_evicted_by_controller": self.stats.evicted_by_controller,
                "lp_jobs_completed": self.stats.completed_lp_jobs,
                "lp_jobs_withdrawn": self.stats.withdrawn_lp_jobs,
                "lp_gang_rollbacks": self.stats.lp_gang_rollbacks,
                "lp_resubmissions": self.stats.lp_resubmissions,
                "lp_pods_killed_by_gpu_failures": self.stats.lp_pods_killed,
                "job_pods_killed_by_gpu_failures": self.stats.job_pods_killed,
                "double_allocations": self.stats.double_allocations,
                "assignment_mismatches": self.stats.assignment_mismatches,
                "gpunode_status_patches": self.stats.status_patches,
                "controller_timeouts": self.stats.controller_timeouts,
                "http_calls": dict(sorted(self.client.stats.calls.items())),
                "http_errors": sum(self.client.stats.errors.values()),
            },
            "notes": self.stats.notes[:50],
            "cycles": [c.as_dict() for c in self.cycles],
            "samples": [
                {
                    "t": x.t,
                    "job_gpus": x.job_gpus,
                    "job_ha": x.job_ha,
                    "job_ha_share": x.job_ha_share,
                    "cluster_ha_share": round(x.cluster_ha_share, 4),
                    "static_ha_share": round(x.static_ha_share, 4),
                    "full": x.full,
                    "job_standby_gpus": x.job_standby_gpus,
                    "standby_in_use": x.standby_in_use,
                    "lp_running_gpus": x.lp_running_gpus,
                }
                for x in self.samples
            ],
        }


async def _ignore(event: WatchEvent) -> None:
    """An informer's handler when only its cache is read."""


def _named(holder: str | SimPod) -> str:
    """``namespace/name`` of a holder in :meth:`Simulation.check_invariants` (formatted only
    for a violation)."""
    return holder if isinstance(holder, str) else f"{holder.namespace}/{holder.name}"


FINAL_PHASE_VALUES: Final = frozenset(p.value for p in FINAL_PHASES)


def _phase(obj: JsonObj | None) -> str | None:
    if obj is None:
        return None
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase else LeasePhase.PENDING.value


def build_world(scenario: Scenario) -> World:
    """LP arrivals (trace or synthetic), the tide and the GPU outage histories for a scenario.
    Missing trace files fall back to synthetic arrivals and the plain Fig. 2 tide, with the
    reason in ``lp_source``/``tide_source``."""
    s = scenario
    data = s.data_dir
    lp_source: str
    arrivals: list[traces.PodArrival]
    trace_file = data / traces.TRACE_FILES[s.trace] if s.trace in traces.TRACE_FILES else None
    lp_phase: dict[str, Any] = {"method": "synthetic: diurnal rate peaking at 14:00", "shift_hours": 0.0}
    if trace_file is not None and trace_file.is_file():
        jobs = traces.parse_jobs(traces.read_text(trace_file), source=str(trace_file))
        shift, lp_phase = lp_daily_phase(s.trace, jobs)
        scaling = traces.Scaling(
            target_load=s.lp_target_load,
            horizon=s.horizon,
            gpu_scale=s.alibaba_gpu_scale if s.trace == "alibaba" else 1.0,
            max_job_gpus=s.general_gpus // 4,
            max_duration=s.lp_max_duration,
            gpus_per_node=s.gpus_per_node,
            shift=shift,
        )
        arrivals = traces.scale_jobs(jobs, scaling, seed=s.seed)
        lp_source = f"trace:{trace_file}"
    else:
        why = "requested" if s.trace == "synthetic" else f"MISSING {trace_file}"
        log.warning("LP arrivals are synthetic", extra=ctx(reason=why))
        arrivals = traces.synthetic_arrivals(
            s.lp_target_load, s.horizon, seed=s.seed, max_duration=s.lp_max_duration
        )
        lp_source = f"synthetic ({why})"
    helios = data / traces.HELIOS_MONTH
    the_tide: tide.Demand
    if s.tide_kind == "irregular":
        the_tide = tide.IrregularTide(seed=s.seed, horizon=s.horizon)
        tide_source = "irregular: peaks and troughs of 10 min to 6 h (log-uniform), seeded"
    elif s.shape_tide and helios.is_file():
        the_tide = tide.Tide.shaped(traces.parse_util(traces.read_text(helios), source=str(helios)))
        tide_source = f"Fig. 2 cosine 0.39–0.92 shaped by {helios}"
    else:
        the_tide = tide.Tide()
        tide_source = "Fig. 2 cosine 0.39–0.92" + ("" if not s.shape_tide else f" (no {helios})")
    model = failures.FailureModel.calibrated()
    if s.failure_scale != 1.0:
        model = dataclasses.replace(
            model, good_rate=model.good_rate * s.failure_scale, flaky_rate=model.flaky_rate * s.failure_scale
        )
    outages: dict[DeviceKey, tuple[failures.Interval, ...]] = {}
    for node in general_nodes(s) + standby_nodes(s):
        for i in range(s.gpus_per_node):
            outages[DeviceKey(node, i)] = failures.outages(
                model, node, i, seed=s.seed, start=-s.tier_window - traces.DAY, end=s.horizon + s.tick
            )
    gpu_models = assign_models(general_nodes(s), s.gpu_models) | assign_models(standby_nodes(s), s.gpu_models)
    demand = demandtrace.DemandTrace(
        base=the_tide,
        peak_gpus=s.job_gpus,
        seed=s.seed,
        horizon=s.horizon,
        day_noise=s.demand_noise,
        peaks_per_day=s.surprise_peaks,
    )
    if s.demand_noise or s.surprise_peaks:
        tide_source += "; " + demand.describe()
    return World(tuple(arrivals), lp_source, demand, tide_source, outages, model, gpu_models, lp_phase)


CLOCKED_TRACES: Final = frozenset({"philly"})
"""Traces whose submit times keep their wall clock (Philly: seconds from 2017-10-09 00:00,
the log's time of day); the others start at an unknown hour."""


def lp_daily_phase(trace: str, jobs: list[traces.Job]) -> tuple[float, dict[str, Any]]:
    """The shift (s) to put ``trace``'s ``jobs`` in the simulated day, and how it was found
    (for the report): a clocked trace keeps its clock; another is aligned to the Fig. 2 tide
    by its own daily rhythm (:func:`flexlease.sim.traces.daily_phase`; the reference is the
    tide's hour-of-day demand, without the Helios shaping), or kept as recorded when it has
    no daily rhythm."""
    if trace in CLOCKED_TRACES:
        return 0.0, {"method": "the trace's own clock", "shift_hours": 0.0}
    reference = [tide.Tide().demand(h * 3600.0 + 1800.0) for h in range(24)]
    phase = traces.daily_phase(jobs, reference)
    method = (
        "aligned to the tide's hour-of-day demand by the trace's own daily rhythm"
        if phase.periodic
        else "no daily rhythm (autocorrelation at 24 h too low): as recorded"
    )
    return phase.shift, {
        "method": method,
        "shift_hours": round(phase.shift / 3600.0, 3),
        "correlation": phase.correlation,
        "autocorrelation_24h": phase.autocorrelation,
        "hourly_arrivals": list(traces.hourly_arrivals(jobs, shift=phase.shift - jobs[0].submit)),
    }


def iter_policies(choice: str) -> Iterable[Policy]:
    """``all`` → ror, plain, static; ``both`` → ror then plain; otherwise that one policy.
    Raises ``ValueError``."""
    if choice == "all":
        return (Policy.ROR, Policy.PLAIN, Policy.STATIC)
    if choice == "both":
        return (Policy.ROR, Policy.PLAIN)
    return (Policy(choice),)
