"""Lend and Reclaim decisions (WeFlex §3.2 steps a–d, §3.5; DESIGN §3). Pure; no I/O.

Each ``plan_*`` function takes what the store holds (a GPULease, a :class:`ClusterView`, the
owner's :class:`Ledger`, the time) and returns the writes that bring the world one step
closer to the lease's goal. Plans are level-triggered and idempotent: planning again on the
state a plan produced yields no new writes, so the controller can be restarted at any point.
Intent is recorded before acting: a plan's ``status`` (lent devices, chosen replacements,
preempted pods) is written first and every later plan re-derives the side effects from it.

**Lend** (the owner scales down). ``spec.devices`` names the GPUs the owner's pods give up;
``spec.count`` asks the controller to find them: it records the GPUs the owner's pods hold
when it first sees the lease (annotation ``flexlease.io/lend-baseline``) and lends the first
``count`` of those (ordered by node, index) that the pods stop holding — so a count Lend must
be created *before* the pods go. Coordinator protection (WeFlex §3.4): the GPUs of pods whose
``flexlease.io/role`` their framework profile marks critical are never part of a baseline, and
a Lend that would need them (``spec.devices`` naming one, or a ``count`` larger than what the
other pods hold) is refused — Failed, condition reason ``CriticalRole``, a ``LendFailed``
Warning Event — instead of waiting for a coordinator to go. In both forms ``count`` counts
released GPUs, LA included: an HA or MA GPU is tagged ``spec.devices["<i>"].owner = <owner>``
with ``leasedAt`` and recorded with its model and tier in ``status.lent``; an LA GPU goes back
untagged. An HA or MA GPU of a standby-pool node (a standby supplement the owner held) goes
back to the standby pool untagged and is recorded ``inKind``: the owner's right-of-return to
it is in kind (this GPU when it is still free at the Reclaim, else a standby GPU of the same
model and a tier >= its lend-time tier). A GPU the owner's pods still hold is waited for.
Done when every GPU is released.

**Reclaim** (the owner scales up). The targets are fixed on the first reconcile and recorded
in ``status.lent``: ``spec.devices`` (each must be lent by the owner), or ``count`` of the
owner's outstanding loans (:func:`_outstanding`: lent GPUs still tagged for it, lent in kind
and not held by it, or on a vanished GPUNode), cheapest first (already held by the owner,
free, held by LP pods, then the rest); a count larger than what is outstanding takes
everything. Per target, every reconcile:

* held by a pod of the owner → back (``status.reclaimed``; the tag is released);
* held by an LP pod (priority label not ``high``) → graceful reclaim: ``preempt-deadline`` =
  now + ``gracePeriodSeconds`` on the pod and an Event; once past the deadline, evict;
* failed (Unhealthy/Unknown), vanished (device or GPUNode gone), downgraded below its
  lend-time tier (right-of-return is in kind), held by another owner's HP pod (which cannot
  be preempted) or by a pod whose ``flexlease.io/role`` its framework profile marks critical
  (a coordinator, Ray head or rank 0 is never evicted: WeFlex §3.4) → replaced one-for-one
  by a free, untagged, healthy standby GPU of the same model and a tier >= the original's
  lend-time tier (lowest adequate tier first), tagged with the owner and recorded in
  ``status.supplementedFromStandby`` (``returned`` once the owner's pods hold it); no such GPU
  → wait (condition ``GPUsFreed`` reason ``StandbyShortfall``) until ``standby_wait`` seconds
  after the Reclaim was accepted, then **unrecoverable** (``status.unrecoverable``: reason
  ``NoStandbyOfModel`` when the pool holds no healthy GPU of that model and tier,
  ``StandbyExhausted`` when none of them was free; ``LendRecordIncomplete`` at once when the
  lend-time model or tier is unknown), its tag released, a Warning Event;
* free and healthy → keep it tagged and wait for the owner's pods.

**End state** (DESIGN §2): Done when every target is back (the owner's pods held it or its
replacement) or unrecoverable — exactly that, per device; until then InProgress, with
condition ``Returned`` False and the reason it waits for (``WaitingForOwner``,
``GracePeriod``, ``Evicting``, ``EvictionBlocked``, ``StandbyShortfall``). Failed only for an
invalid spec.

**Overlap** (:class:`~extender.lease.ledger.Ledger`): the newest directive of an owner wins.
A Lend superseded by a newer Reclaim lends what is released now and ends Done (everything it
asked for was lent) or Cancelled; a Pending Reclaim waits (``Accepted`` False,
``WaitingForLend``) for older unfinished Lends and for older Reclaims a Lend supersedes, so that
no lent GPU escapes it; an InProgress Reclaim superseded by a newer Lend ends Done (everything
back) or Cancelled, handing what is not back over in ``status.stillLent`` (the target, or the
replacement already chosen for it; standby ones back to the pool, in kind), where the next
Reclaim finds it. Both carry ``status.supersededBy`` and condition ``Superseded``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime, timedelta

from extender.lease.ledger import FINISHED, Ledger
from extender.lease.view import ClusterView, Gpu, Holder
from flexlease.api import keys
from flexlease.api.pod import Assignment, Priority
from flexlease.api.resources import (
    Condition,
    DeviceKey,
    GPULease,
    GPULeaseStatus,
    LeaseAction,
    LeaseDevice,
    LeasePhase,
    Pool,
    Supplement,
    Unrecoverable,
)
from flexlease.api.tiers import Tier
from flexlease.errors import PodSpecError

DEFAULT_STANDBY_WAIT_SECONDS = 600.0
"""``lease.standby_wait_seconds``' default (see :func:`plan_reclaim`)."""
COND_ACCEPTED = "Accepted"
"""Set when the controller takes a lease up; its ``lastTransitionTime`` is when work began."""
COND_TAGGED = "Tagged"
COND_FREED = "GPUsFreed"

REASON_FREED = "Freed"
REASON_GRACE = "GracePeriod"
REASON_EVICTING = "Evicting"
REASON_EVICTION_BLOCKED = "EvictionBlocked"
REASON_SHORTFALL = "StandbyShortfall"
REASON_WAITING = "WaitingForRelease"
REASON_TAGGED = "Tagged"
REASON_CRITICAL = "CriticalRole"
"""A Lend refused because it would take GPUs from a pod whose role is critical."""
COND_SUPERSEDED = "Superseded"
"""Set when a newer lease of the opposite action ended this one: reason ``Finished`` (it
reached its end state) or ``Cancelled``; ``status.supersededBy`` names the newer lease."""
REASON_FINISHED = "Finished"
REASON_CANCELLED = "Cancelled"
COND_RETURNED = "Returned"
"""A Reclaim's end state: True once every target is back, replaced or unrecoverable (reason
``Returned`` or ``PartlyUnrecoverable``); False with the reason it waits for."""
REASON_RETURNED = "Returned"
REASON_PARTLY_UNRECOVERABLE = "PartlyUnrecoverable"
REASON_WAITING_FOR_OWNER = "WaitingForOwner"
REASON_WAITING_FOR_LEND = "WaitingForLend"
UNRECOVERABLE_NO_STANDBY = "NoStandbyOfModel"
"""A target needs a replacement and the standby pool holds no healthy GPU of its model with
a tier >= its lend-time tier."""
UNRECOVERABLE_EXHAUSTED = "StandbyExhausted"
"""A target needs a replacement; the standby pool holds GPUs of its model and tier, none free."""
UNRECOVERABLE_INCOMPLETE = "LendRecordIncomplete"
"""A target needs a replacement and its lend-time model or tier is unknown."""


class EventType(enum.StrEnum):
    """core/v1 Event ``type``."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class TagChange:
    """Set (``owner`` not None) or clear the right-of-return tag of one GPU."""

    key: DeviceKey
    owner: str | None
    _: KW_ONLY
    leased_at: datetime | None


@dataclass(frozen=True, slots=True)
class Notice:
    """Write ``preempt-deadline`` = ``deadline`` on ``pod`` and tell it with an Event."""

    pod: Holder
    deadline: datetime
    _: KW_ONLY
    devices: tuple[DeviceKey, ...]


@dataclass(frozen=True, slots=True)
class Eviction:
    """Evict ``pod`` through the Eviction API (its grace period is over)."""

    pod: Holder
    devices: tuple[DeviceKey, ...]


@dataclass(frozen=True, slots=True)
class Note:
    """An Event about the lease itself."""

    reason: str
    message: str
    type: EventType = EventType.NORMAL


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasePlan:
    """Writes for one lease, in the order the controller applies them: ``baseline`` (lease
    annotation, count Lends only, None = leave), ``status`` (only when it differs), ``tags``,
    ``notices``, ``evictions``, ``notes``. ``requeue_after``: seconds until a grace period ends."""

    status: GPULeaseStatus
    baseline: tuple[DeviceKey, ...] | None = None
    tags: tuple[TagChange, ...] = ()
    notices: tuple[Notice, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    notes: tuple[Note, ...] = ()
    requeue_after: float | None = None


@dataclass(frozen=True, slots=True)
class PoolChange:
    """Move the GPUNode ``node`` to ``pool``; ``gpus`` = its free healthy GPUs, for the Event."""

    node: str
    pool: Pool
    _: KW_ONLY
    gpus: int


# --------------------------------------------------------------------------- helpers


def format_baseline(devices: Iterable[DeviceKey]) -> str:
    """``<node>:<idx>,<idx>;<node>:<idx>`` (nodes and indices sorted); empty string for none."""
    by_node: dict[str, list[int]] = {}
    for d in sorted(devices):
        by_node.setdefault(d.node, []).append(d.index)
    return ";".join(Assignment(node, tuple(idx)).format() for node, idx in by_node.items())


def parse_baseline(value: str) -> tuple[DeviceKey, ...]:
    """Inverse of :func:`format_baseline`, sorted. Raises :class:`PodSpecError` when malformed."""
    out: set[DeviceKey] = set()
    for part in filter(None, value.split(";")):
        out.update(Assignment.parse(part).devices)
    return tuple(sorted(out))


def set_condition(
    conditions: Sequence[Condition], *, type: str, status: bool, reason: str, message: str, now: datetime
) -> list[Condition]:
    """``conditions`` with ``type`` set; ``lastTransitionTime`` moves only when status flips
    (``metav1.Condition`` semantics)."""
    value = "True" if status else "False"
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type != type:
            out.append(c)
            continue
        found = True
        when = c.last_transition_time if c.status == value else now
        out.append(
            Condition(type=type, status=value, reason=reason, message=message, last_transition_time=when)
        )
    if not found:
        out.append(
            Condition(type=type, status=value, reason=reason, message=message, last_transition_time=now)
        )
    return out


def _whole_second(value: datetime) -> datetime:
    """Round up to a whole second: deadlines are written as RFC 3339 at second precision."""
    return value if value.microsecond == 0 else value.replace(microsecond=0) + timedelta(seconds=1)


def _record(gpu: Gpu) -> LeaseDevice:
    return LeaseDevice(node=gpu.key.node, index=gpu.key.index, model=gpu.model, tier=gpu.tier)


def _bare(key: DeviceKey) -> LeaseDevice:
    return LeaseDevice(node=key.node, index=key.index)


def _phase_notes(old: GPULeaseStatus, new: GPULeaseStatus, *, action: LeaseAction) -> list[Note]:
    if old.phase == new.phase:
        return []
    if new.phase is LeasePhase.IN_PROGRESS:
        return [Note(f"{action.value}Started", new.message)]
    if new.phase is LeasePhase.DONE:
        return [Note(f"{action.value}Done", new.message)]
    if new.phase is LeasePhase.FAILED:
        return [Note(f"{action.value}Failed", new.message, EventType.WARNING)]
    if new.phase is LeasePhase.CANCELLED:
        return [Note(f"{action.value}Cancelled", new.message)]
    return []


def _accept(status: GPULeaseStatus, message: str, *, now: datetime) -> GPULeaseStatus:
    conditions = set_condition(
        status.conditions, type=COND_ACCEPTED, status=True, reason="Accepted", message=message, now=now
    )
    return status.model_copy(update={"conditions": conditions})


def _failed(lease: GPULease, message: str, *, now: datetime, reason: str = "Invalid") -> LeasePlan:
    cond = COND_TAGGED if lease.spec.action is LeaseAction.LEND else COND_FREED
    status = lease.status.model_copy(
        update={
            "phase": LeasePhase.FAILED,
            "message": message,
            "conditions": set_condition(
                lease.status.conditions, type=cond, status=False, reason=reason, message=message, now=now
            ),
        }
    )
    return LeasePlan(status=status, notes=tuple(_phase_notes(lease.status, status, action=lease.spec.action)))


def _superseded(
    lease: GPULease, status: GPULeaseStatus, *, by: str, finished: bool, detail: str, now: datetime
) -> LeasePlan:
    """End ``lease`` (its ``status`` as planned so far) because the newer lease ``by`` of the
    opposite action supersedes it: Done (``finished``) or Cancelled, with condition
    ``Superseded`` (reason ``Finished``/``Cancelled``), ``status.supersededBy`` and an Event."""
    reason = REASON_FINISHED if finished else REASON_CANCELLED
    message = f"superseded by {by}: {'finished' if finished else 'cancelled'}, {detail}"
    new_status = status.model_copy(
        update={
            "phase": LeasePhase.DONE if finished else LeasePhase.CANCELLED,
            "superseded_by": by,
            "message": message if not status.message else f"{message} ({status.message})",
            "conditions": set_condition(
                status.conditions, type=COND_SUPERSEDED, status=True, reason=reason, message=message, now=now
            ),
        }
    )
    return LeasePlan(
        status=new_status, notes=tuple(_phase_notes(lease.status, new_status, action=lease.spec.action))
    )


def _join(parts: Iterable[str]) -> str:
    return ", ".join(p for p in parts if p)


def _n(count: int, text: str) -> str:
    return f"{count} {text}" if count else ""


# --------------------------------------------------------------------------- Lend


def plan_lend(
    lease: GPULease, view: ClusterView, *, now: datetime, superseded_by: str | None = None
) -> LeasePlan:
    """The next step of a Lend lease (see the module docstring). ``superseded_by``: the newer
    Reclaim of the owner (:attr:`Ledger.superseded_by`): the Lend lends what is released now
    and ends, Done when that is everything it asked for, else Cancelled. Never raises: bad
    input becomes a Failed status with a message naming the problem."""
    status = lease.status
    if status.phase in FINISHED:
        return LeasePlan(status=status)
    spec = lease.spec
    if (
        superseded_by is not None
        and spec.count is not None
        and keys.ANN_LEND_BASELINE not in lease.metadata.annotations
    ):
        return _superseded(
            lease,
            status,
            by=superseded_by,
            finished=False,
            detail="before it recorded the GPUs to lend: nothing was lent",
            now=now,
        )
    owner = spec.owner
    held = view.held_by(owner)
    critical = {d: h for h in view.holders.values() if h.belongs_to(owner) and h.critical for d in h.devices}
    new_baseline: tuple[DeviceKey, ...] | None = None

    if spec.devices is not None:
        wanted = [d.key for d in spec.devices]
        if status.phase is LeasePhase.PENDING:
            protected = [f"{k} ({critical[k].key})" for k in sorted(set(wanted)) if k in critical]
            if protected:
                return _failed(
                    lease,
                    f"refused: {', '.join(protected)} held by pods whose flexlease.io/role is critical "
                    "in their framework profile (coordinator, head, rank 0); a Lend never scales a job "
                    "below its critical pods — name GPUs of other pods",
                    now=now,
                    reason=REASON_CRITICAL,
                )
            problems: list[str] = []
            if len(set(wanted)) != len(wanted):
                problems.append("spec.devices lists a GPU twice")
            for key in wanted:
                gpu = view.gpus.get(key)
                if gpu is None or not gpu.present:
                    problems.append(f"{key} is not a GPU any node agent reports")
                elif gpu.owner not in (None, owner):
                    problems.append(f"{key} is already lent by {gpu.owner}")
            if problems:
                return _failed(lease, "; ".join(problems), now=now)
        candidates = sorted(set(wanted))
        target = len(candidates)
    else:
        assert spec.count is not None  # GPULeaseSpec guarantees devices xor count
        raw = lease.metadata.annotations.get(keys.ANN_LEND_BASELINE)
        if raw is None:
            # the GPUs of critical pods are never candidates: the job keeps its coordinator
            baseline = tuple(sorted(k for k in held if k in view.gpus and k not in critical))
            if len(baseline) < spec.count:
                kept = len([k for k in critical if k in view.gpus])
                if kept and len(baseline) + kept >= spec.count:
                    return _failed(
                        lease,
                        f"refused: spec.count={spec.count} would take the job below its critical pods "
                        f"(coordinator, head, rank 0 by their framework profile): they hold {kept} of "
                        f"its {len(baseline) + kept} GPUs and are never scaled down; "
                        f"lend at most {len(baseline)}",
                        now=now,
                        reason=REASON_CRITICAL,
                    )
                return _failed(
                    lease,
                    f"the owner's pods hold {len(baseline) + kept} GPUs, fewer than spec.count={spec.count}; "
                    "create a count Lend before the pods release their GPUs, or name spec.devices",
                    now=now,
                )
            new_baseline = baseline
        else:
            try:
                baseline = parse_baseline(raw)
            except PodSpecError as exc:
                return _failed(lease, f"annotation {keys.ANN_LEND_BASELINE}: {exc}", now=now)
        candidates = [k for k in baseline if k not in held][: spec.count]
        target = spec.count

    if status.phase is LeasePhase.PENDING:
        status = _accept(status, f"lending the GPUs {owner}'s pods release", now=now)
    lent = list(status.lent)
    lent_keys = {d.key for d in lent}
    in_kind = {d.key for d in lent if d.in_kind}
    tags: list[TagChange] = []
    untagged_la: list[DeviceKey] = []
    vanished: list[DeviceKey] = []
    foreign: list[DeviceKey] = []
    waiting = [k for k in candidates if k in held]
    for key in candidates:
        if key in held:
            continue
        gpu = view.gpus.get(key)
        if key in lent_keys:  # recorded before: make sure the tag is there (in kind: is not)
            if gpu is not None and key in in_kind and gpu.owner == owner:
                tags.append(TagChange(key, None, leased_at=None))
            elif gpu is not None and key not in in_kind and gpu.owner is None:
                tags.append(TagChange(key, owner, leased_at=now))
            continue
        if gpu is None or not gpu.present:
            vanished.append(key)
        elif gpu.owner not in (None, owner):
            foreign.append(key)
        elif gpu.tier is None or gpu.tier < Tier.MA:
            untagged_la.append(key)
            if gpu.owner == owner:
                tags.append(TagChange(key, None, leased_at=None))
        elif gpu.pool is Pool.STANDBY:
            # a standby supplement the owner held goes back to the standby pool, untagged;
            # the owner keeps a right-of-return in kind (DESIGN §2)
            lent.append(_record(gpu).model_copy(update={"in_kind": True}))
            lent_keys.add(key)
            in_kind.add(key)
            if gpu.owner is not None:
                tags.append(TagChange(key, None, leased_at=None))
        else:
            lent.append(_record(gpu))
            lent_keys.add(key)
            if gpu.owner != owner:
                tags.append(TagChange(key, owner, leased_at=now))

    released = len(candidates) - len(waiting)
    done = not waiting and released >= target
    chosen = set(candidates)
    n_lent = sum(1 for d in lent if d.key in chosen and not d.in_kind)
    n_kind = sum(1 for d in lent if d.key in chosen and d.in_kind)
    message = _join(
        [
            f"lent {n_lent} HA/MA GPUs tagged for {owner}",
            _n(n_kind, "standby GPUs back to the standby pool, lent in kind"),
            _n(len(untagged_la), "LA GPUs released untagged"),
            _n(len(vanished), "GPUs vanished before tagging"),
            _n(len(foreign), "GPUs left with another owner's tag"),
            _n(len(waiting), "GPUs still held by the owner's pods"),
            _n(max(0, target - len(candidates)), "GPUs not yet released by the owner's pods"),
        ]
    )
    new_status = status.model_copy(
        update={
            "phase": LeasePhase.DONE if done else LeasePhase.IN_PROGRESS,
            "lent": lent,
            "message": message,
            "conditions": set_condition(
                status.conditions,
                type=COND_TAGGED,
                status=done,
                reason=REASON_TAGGED if done else REASON_WAITING,
                message=message,
                now=now,
            ),
        }
    )
    if superseded_by is not None:
        not_lent = len(waiting) + max(0, target - len(candidates))
        detail = (
            "every GPU it asked for was lent"
            if done
            else f"{not_lent} GPUs its owner's pods did not release were not lent;"
            f" the {len(lent)} lent stay lent"
        )
        superseded = _superseded(lease, new_status, by=superseded_by, finished=done, detail=detail, now=now)
        return replace(superseded, baseline=new_baseline, tags=tuple(tags))
    return LeasePlan(
        status=new_status,
        baseline=new_baseline,
        tags=tuple(tags),
        notes=tuple(_phase_notes(lease.status, new_status, action=LeaseAction.LEND)),
    )


# --------------------------------------------------------------------------- Reclaim


def _outstanding(view: ClusterView, ledger: Ledger, owner: str) -> dict[DeviceKey, LeaseDevice]:
    """The owner's GPUs out on loan and claimed by no other open Reclaim: lent GPUs still
    tagged for it, lent GPUs whose GPUNode is gone, GPUs lent in kind that its pods do not
    hold, and GPUs tagged for it without a record (an operator's tag). A tagged GPU its pods
    took back is untagged by then and no longer out. Lend-time model and tier win over what
    the agent reports now (it downgrades a failed GPU's tier at once)."""
    out: dict[DeviceKey, LeaseDevice] = {}
    for key, record in ledger.records.items():
        if key in ledger.claimed:
            continue
        gpu = view.gpus.get(key)
        if record.in_kind:
            if gpu is not None and gpu.holder is not None and gpu.holder.belongs_to(owner):
                continue  # back with the owner before the Reclaim
        elif key.node in view.pools and (gpu is None or gpu.owner != owner):
            continue
        complete = record.model is not None and record.tier is not None
        if complete or gpu is None or not gpu.present:
            out[key] = record
        else:
            out[key] = _record(gpu).model_copy(update={"in_kind": record.in_kind})
    for gpu in view.tagged(owner):
        if gpu.key not in ledger.claimed and gpu.key not in out:
            out[gpu.key] = _record(gpu)
    return out


def _cost(view: ClusterView, key: DeviceKey, *, owner: str) -> int:
    gpu = view.gpus.get(key)
    if gpu is None or gpu.failed:
        return 3
    if gpu.holder is None:
        return 1
    if gpu.holder.belongs_to(owner):
        return 0
    return 2 if gpu.holder.priority is Priority.LOW and not gpu.holder.critical else 3


def _choose_targets(lease: GPULease, view: ClusterView, *, ledger: Ledger) -> tuple[list[LeaseDevice], str]:
    """Targets of a Pending Reclaim, or ``([], problem)``."""
    owner = lease.spec.owner
    outstanding = _outstanding(view, ledger, owner)
    if lease.spec.devices is None:
        assert lease.spec.count is not None
        ordered = sorted(outstanding, key=lambda k: (_cost(view, k, owner=owner), k))
        return [outstanding[k] for k in sorted(ordered[: lease.spec.count])], ""
    held = view.held_by(owner)
    targets: list[LeaseDevice] = []
    problems: list[str] = []
    seen: set[DeviceKey] = set()
    for device in lease.spec.devices:
        key = device.key
        if key in seen:
            problems.append(f"{key} is listed twice")
            continue
        seen.add(key)
        gpu = view.gpus.get(key)
        if key in ledger.claimed:
            problems.append(f"{key} is being reclaimed by another lease of {owner}")
        elif key in outstanding:
            targets.append(outstanding[key])
        elif key in ledger.records:
            targets.append(ledger.records[key])
        elif key in held and gpu is not None:
            targets.append(_record(gpu))
        else:
            problems.append(f"{key} is not lent by {owner}")
    if problems:
        return [], "; ".join(problems)
    return targets, ""


def _pick_replacement(
    view: ClusterView, original: LeaseDevice, *, owner: str, used: set[DeviceKey]
) -> Gpu | None:
    """FETCHSTANDBY(1, tier) of Algorithm 1 for one lent GPU: a free, healthy standby GPU of
    the same model with tier >= the original's. Prefers an unaccounted GPU already tagged
    with ``owner``, then the lowest adequate tier, then (node, index)."""
    assert original.model is not None and original.tier is not None
    best: tuple[int, int, DeviceKey] | None = None
    choice: Gpu | None = None
    for gpu in view.gpus.values():
        if (
            gpu.pool is not Pool.STANDBY
            or gpu.failed
            or gpu.holder is not None
            or gpu.key in used
            or gpu.model != original.model
            or gpu.tier is None
            or gpu.tier < original.tier
            or gpu.owner not in (None, owner)
        ):
            continue
        rank = (0 if gpu.owner == owner else 1, gpu.tier.rank, gpu.key)
        if best is None or rank < best:
            best, choice = rank, gpu
    return choice


@dataclass
class _Progress:
    noticed_before: frozenset[str] = frozenset()
    reclaimed: list[LeaseDevice] = field(default_factory=list)
    reclaimed_keys: set[DeviceKey] = field(default_factory=set)
    """The keys of ``reclaimed`` (kept with it: looked up once per target)."""
    supplements: dict[DeviceKey, Supplement] = field(default_factory=dict)
    unrecoverable: dict[DeviceKey, Unrecoverable] = field(default_factory=dict)
    new_unrecoverable: list[Unrecoverable] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    tags: dict[DeviceKey, TagChange] = field(default_factory=dict)
    notices: dict[str, Notice] = field(default_factory=dict)
    evictions: dict[str, Eviction] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    returned: int = 0
    waiting_owner: list[DeviceKey] = field(default_factory=list)
    in_grace: set[str] = field(default_factory=set)
    blocked: set[str] = field(default_factory=set)
    shortfall: list[str] = field(default_factory=list)
    wake: float | None = None

    def tag(self, change: TagChange) -> None:
        self.tags[change.key] = change

    def wake_in(self, seconds: float) -> None:
        self.wake = seconds if self.wake is None else min(self.wake, seconds)

    def give_up(self, target: LeaseDevice, reason: str, message: str, *, untag: DeviceKey | None) -> None:
        """``target`` is unrecoverable (listed in the status and told in an Event); ``untag``:
        the GPU (it, or its failed replacement) whose tag for the owner is released."""
        if untag is not None:
            self.tag(TagChange(untag, None, leased_at=None))
        entry = Unrecoverable(
            node=target.node,
            index=target.index,
            model=target.model,
            tier=target.tier,
            reason=reason,
            message=message,
        )
        self.unrecoverable[target.key] = entry
        self.new_unrecoverable.append(entry)


def _standby_of_model(view: ClusterView, target: LeaseDevice) -> int:
    """Healthy standby-pool GPUs of ``target``'s lend-time model with a tier >= its lend-time
    tier, in any state (free, held, tagged)."""
    return sum(
        1
        for g in view.gpus.values()
        if g.pool is Pool.STANDBY
        and not g.failed
        and g.model == target.model
        and g.tier is not None
        and target.tier is not None
        and g.tier >= target.tier
    )


def _reclaim_target(
    target: LeaseDevice,
    view: ClusterView,
    *,
    p: _Progress,
    owner: str,
    grace: int,
    used: set[DeviceKey],
    blocked: Mapping[str, str],
    now: datetime,
    waited: float,
    standby_wait: float,
) -> None:
    if target.key in p.unrecoverable:
        return
    if target.key in p.reclaimed_keys:
        p.returned += 1
        return
    sup = p.supplements.get(target.key)
    if sup is not None and sup.returned:
        p.returned += 1
        return
    current = sup.replacement.key if sup is not None else target.key
    gpu = view.gpus.get(current)
    if gpu is not None and gpu.holder is not None and gpu.holder.belongs_to(owner):
        p.returned += 1
        if sup is None:
            p.reclaimed.append(target)
            p.reclaimed_keys.add(target.key)
        else:
            p.supplements[target.key] = sup.model_copy(update={"returned": True})
        if gpu.owner == owner:
            p.tag(TagChange(current, None, leased_at=None))
        return
    foreign_hp = gpu is not None and gpu.holder is not None and gpu.holder.priority is Priority.HIGH
    # Coordinator protection (§3.4): a pod whose role is critical is never noticed or evicted.
    critical = gpu is not None and gpu.holder is not None and gpu.holder.critical
    # Right-of-return is in kind (§3.5): a GPU whose tier fell below its lend-time tier (the
    # agent downgrades at once on failure, even when the GPU recovers) is replaced as well.
    downgraded = (
        gpu is not None and gpu.tier is not None and target.tier is not None and gpu.tier < target.tier
    )
    if gpu is None or gpu.failed or foreign_hp or critical or downgraded:
        why = (
            "vanished"
            if gpu is None or not gpu.present
            else "failed"
            if gpu.failed
            else "held by a HP pod"
            if foreign_hp
            else "held by a critical pod"
            if critical
            else f"downgraded to {gpu.tier.value if gpu.tier else '?'}"
        )
        untag = gpu is not None and gpu.owner == owner  # released when given up or replaced
        if target.model is None or target.tier is None:
            reason = UNRECOVERABLE_INCOMPLETE
            detail = "its lend-time model or tier is unknown, so no replacement can be chosen"
            p.give_up(target, reason, f"{current} {why}; {detail}", untag=current if untag else None)
            return
        replacement = _pick_replacement(view, target, owner=owner, used=used)
        if replacement is None:
            wanted = f"{target.model}, tier >= {target.tier.value}"
            if waited < standby_wait:
                p.shortfall.append(f"{target.key} ({wanted})")
                p.wake_in(standby_wait - waited)
                return
            pool = _standby_of_model(view, target)
            reason = UNRECOVERABLE_EXHAUSTED if pool else UNRECOVERABLE_NO_STANDBY
            detail = (
                f"the standby pool's {pool} GPUs of that model and tier stayed in use"
                if pool
                else "the standby pool holds no healthy GPU of that model and tier"
            )
            message = f"{current} {why}; no standby GPU ({wanted}) within {standby_wait:g} s: {detail}"
            p.give_up(target, reason, message, untag=current if untag else None)
            return
        used.add(replacement.key)
        p.supplements[target.key] = Supplement(original=_bare(target.key), replacement=_record(replacement))
        p.tag(TagChange(replacement.key, owner, leased_at=now))
        if gpu is not None and gpu.owner == owner:
            p.tag(TagChange(current, None, leased_at=None))
        p.notes.append(
            Note(
                "Supplemented",
                f"{current} ({why}) replaced by standby {replacement.key} "
                f"({replacement.model}, {replacement.tier.value if replacement.tier else '?'})",
            )
        )
        p.waiting_owner.append(replacement.key)
        return
    if gpu.holder is not None:  # an LP pod of another tenant: graceful reclaim
        holder = gpu.holder
        if gpu.owner is None:
            p.tag(TagChange(current, owner, leased_at=now))
        if holder.key not in p.preempted:
            p.preempted.append(holder.key)
        if holder.terminating:  # already going away: wait for it, no second notice or eviction
            p.in_grace.add(holder.key)
            return
        deadline = holder.deadline
        if (
            deadline is not None
            and holder.key not in p.noticed_before
            and (now - deadline).total_seconds() > grace
        ):
            deadline = None  # a notice left from an earlier reclaim: give a fresh grace period
        if deadline is None:
            notice = p.notices.get(holder.key)
            devices = (*notice.devices, current) if notice is not None else (current,)
            deadline = _whole_second(now + timedelta(seconds=grace))
            p.notices[holder.key] = Notice(holder, deadline, devices=devices)
            p.in_grace.add(holder.key)
            p.wake_in((deadline - now).total_seconds())
        elif now < deadline:
            p.in_grace.add(holder.key)
            p.wake_in(max(0.0, (deadline - now).total_seconds()))
        else:
            eviction = p.evictions.get(holder.key)
            devices = (*eviction.devices, current) if eviction is not None else (current,)
            p.evictions[holder.key] = Eviction(holder, devices)
            if holder.key in blocked:
                p.blocked.add(holder.key)
        return
    if gpu.owner is None:  # free: keep it reserved for the owner's pods
        p.tag(TagChange(current, owner, leased_at=now))
    p.waiting_owner.append(current)


def _accepted_at(status: GPULeaseStatus) -> datetime | None:
    return next((c.last_transition_time for c in status.conditions if c.type == COND_ACCEPTED), None)


def _keys(devices: Iterable[DeviceKey], limit: int = 4) -> str:
    shown = sorted(devices)
    text = ", ".join(str(d) for d in shown[:limit])
    return text + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def _cancel_reclaim(lease: GPULease, view: ClusterView, *, by: str, now: datetime) -> LeasePlan:
    """End an InProgress Reclaim that a newer Lend ``by`` supersedes: each target its owner's
    pods hold (as itself or its replacement) is back, each unrecoverable one stays so, and
    every other stays lent — the target itself, or the standby replacement already chosen for
    it — in ``status.stillLent``, tagged for the owner (a GPU of a standby-pool node goes back
    to the pool untagged, lent in kind, as a Lend does). No new replacement, notice or
    eviction. Done when nothing stays lent, else Cancelled."""
    status = lease.status
    owner = lease.spec.owner
    reclaimed = list(status.reclaimed)
    reclaimed_keys = {d.key for d in reclaimed}
    supplements = {s.original.key: s for s in status.supplemented_from_standby}
    gone = {u.key for u in status.unrecoverable}
    still: list[LeaseDevice] = []
    tags: list[TagChange] = []
    for target in status.lent:
        if target.key in reclaimed_keys or target.key in gone:
            continue
        sup = supplements.get(target.key)
        if sup is not None and sup.returned:
            continue
        record = sup.replacement if sup is not None else target
        gpu = view.gpus.get(record.key)
        if gpu is not None and gpu.holder is not None and gpu.holder.belongs_to(owner):
            if sup is None:
                reclaimed.append(target)
                reclaimed_keys.add(target.key)
            else:
                supplements[target.key] = sup.model_copy(update={"returned": True})
            continue
        if gpu is not None and gpu.pool is Pool.STANDBY:
            still.append(record.model_copy(update={"in_kind": True}))
            if gpu.owner == owner:
                tags.append(TagChange(record.key, None, leased_at=None))
        else:
            still.append(record.model_copy(update={"in_kind": None}))
            if gpu is not None and gpu.owner is None:
                tags.append(TagChange(record.key, owner, leased_at=now))
    base = status.model_copy(
        update={
            "reclaimed": reclaimed,
            "supplemented_from_standby": list(supplements.values()),
            "still_lent": still,
        }
    )
    detail = (
        "every target was back or unrecoverable"
        if not still
        else f"{len(still)} GPUs not back stay lent: {_keys(d.key for d in still)}"
    )
    plan = _superseded(lease, base, by=by, finished=not still, detail=detail, now=now)
    return replace(plan, tags=tuple(tags))


def plan_reclaim(
    lease: GPULease,
    view: ClusterView,
    *,
    ledger: Ledger,
    now: datetime,
    blocked: Mapping[str, str] | None = None,
    standby_wait: float = DEFAULT_STANDBY_WAIT_SECONDS,
) -> LeasePlan:
    """The next step of a Reclaim lease (see the module docstring).

    ``ledger`` is the owner's history without this lease (and how this lease stands among
    the owner's others: superseded, waiting); ``blocked`` maps ``<ns>/<pod>`` to the message of
    the last eviction a PodDisruptionBudget refused (reported in the status);
    ``standby_wait``: seconds since the Reclaim was accepted after which a target that needs a
    standby replacement and has none is unrecoverable. Never raises: bad input becomes a
    Failed status with a message.
    """
    status = lease.status
    if status.phase in FINISHED:
        return LeasePlan(status=status)
    owner = lease.spec.owner
    blocked = blocked or {}
    if status.phase is LeasePhase.PENDING:
        if ledger.superseded_by is not None:
            return _superseded(
                lease,
                status,
                by=ledger.superseded_by,
                finished=False,
                detail="before it took its targets: nothing was claimed",
                now=now,
            )
        if ledger.waits_for:
            message = (
                f"waiting for {', '.join(ledger.waits_for)} of {owner} to finish before taking its"
                " targets (a Lend still settling, or a Reclaim a newer Lend cancels)"
            )
            conditions = set_condition(
                status.conditions,
                type=COND_ACCEPTED,
                status=False,
                reason=REASON_WAITING_FOR_LEND,
                message=message,
                now=now,
            )
            return LeasePlan(status=status.model_copy(update={"message": message, "conditions": conditions}))
        targets, problem = _choose_targets(lease, view, ledger=ledger)
        if problem:
            return _failed(lease, problem, now=now)
        asked = (
            f" of {lease.spec.count} asked, all outstanding" if (lease.spec.count or 0) > len(targets) else ""
        )
        status = _accept(
            status.model_copy(update={"lent": targets}), f"reclaiming {len(targets)} GPUs{asked}", now=now
        )
    elif ledger.superseded_by is not None:
        return _cancel_reclaim(lease, view, by=ledger.superseded_by, now=now)
    targets = list(status.lent)
    started = _accepted_at(status) or lease.metadata.creation_timestamp or now
    waited = max(0.0, (now - started).total_seconds())

    p = _Progress(
        noticed_before=frozenset(status.preempted_pods),
        reclaimed=list(status.reclaimed),
        reclaimed_keys={d.key for d in status.reclaimed},
        supplements={s.original.key: s for s in status.supplemented_from_standby},
        unrecoverable={u.key: u for u in status.unrecoverable},
        preempted=list(status.preempted_pods),
    )
    used = (
        {t.key for t in targets} | {s.replacement.key for s in p.supplements.values()} | set(ledger.claimed)
    )
    for target in targets:
        _reclaim_target(
            target,
            view,
            p=p,
            owner=owner,
            grace=lease.spec.grace_period_seconds,
            used=used,
            blocked=blocked,
            now=now,
            waited=waited,
            standby_wait=standby_wait,
        )

    total = len(targets)
    done = p.returned + len(p.unrecoverable) == total
    if p.shortfall:
        reason, freed = REASON_SHORTFALL, False
    elif p.blocked:
        reason, freed = REASON_EVICTION_BLOCKED, False
    elif p.evictions:
        reason, freed = REASON_EVICTING, False
    elif p.in_grace:
        reason, freed = REASON_GRACE, False
    else:
        reason, freed = REASON_FREED, True
    supplemented = list(p.supplements.values())
    message = _join(
        [
            f"{p.returned}/{total} GPUs back with {owner}",
            _n(len(p.reclaimed), "reclaimed"),
            _n(len(supplemented), "supplemented from standby"),
            _n(len(p.unrecoverable), "unrecoverable"),
            _n(len(p.waiting_owner), "free and waiting for the owner's pods"),
            _n(len(p.in_grace), "LP pods in their grace period"),
            _n(len(p.evictions), "LP pods being evicted"),
            _n(len(p.blocked), "evictions refused by a PodDisruptionBudget"),
            "waiting for a standby GPU for " + "; ".join(p.shortfall) if p.shortfall else "",
        ]
    )
    cond_message = message
    if p.blocked:
        cond_message = "; ".join(f"{k}: {blocked[k]}" for k in sorted(p.blocked))
    if done:
        ret_reason = REASON_PARTLY_UNRECOVERABLE if p.unrecoverable else REASON_RETURNED
        ret_message = message
    else:
        ret_reason = REASON_WAITING_FOR_OWNER if freed else reason
        ret_message = (
            f"waiting for {owner}'s pods to take {_keys(p.waiting_owner)}" if freed else cond_message
        )
    conditions = set_condition(
        status.conditions, type=COND_FREED, status=freed, reason=reason, message=cond_message, now=now
    )
    conditions = set_condition(
        conditions, type=COND_RETURNED, status=done, reason=ret_reason, message=ret_message, now=now
    )
    new_status = status.model_copy(
        update={
            "phase": LeasePhase.DONE if done else LeasePhase.IN_PROGRESS,
            "reclaimed": p.reclaimed,
            "supplemented_from_standby": supplemented,
            "unrecoverable": list(p.unrecoverable.values()),
            "preempted_pods": p.preempted,
            "message": message,
            "conditions": conditions,
        }
    )
    notes = list(p.notes)
    if p.new_unrecoverable:
        notes.append(
            Note(
                "Unrecoverable",
                "; ".join(f"{u.key}: {u.reason}: {u.message}" for u in p.new_unrecoverable),
                EventType.WARNING,
            )
        )
    notes.extend(_phase_notes(lease.status, new_status, action=LeaseAction.RECLAIM))
    old_reason = next((c.reason for c in lease.status.conditions if c.type == COND_FREED), None)
    if reason != old_reason and reason in (REASON_SHORTFALL, REASON_EVICTION_BLOCKED):
        notes.append(Note(reason, cond_message, EventType.WARNING))
    return LeasePlan(
        status=new_status,
        tags=tuple(p.tags.values()),
        notices=tuple(p.notices.values()),
        evictions=tuple(p.evictions.values()),
        notes=tuple(notes),
        requeue_after=None if new_status.phase in FINISHED else p.wake,
    )


def plan_lease(
    lease: GPULease,
    view: ClusterView,
    *,
    ledger: Ledger,
    now: datetime,
    blocked: Mapping[str, str] | None = None,
    right_of_return: bool = True,
    standby_wait: float = DEFAULT_STANDBY_WAIT_SECONDS,
) -> LeasePlan:
    """Dispatch on ``spec.action`` to :func:`plan_lend` or :func:`plan_reclaim`. Without
    ``right_of_return`` (plain leasing, ``extender.right_of_return: false``) every lease is
    Failed with a message saying so: nothing is tagged, nothing is returned."""
    if not right_of_return:
        return _failed(
            lease,
            "right-of-return is disabled (extender.right_of_return: false, plain leasing):"
            f" a {lease.spec.action.value} has nothing to tag or return",
            now=now,
        )
    if lease.spec.action is LeaseAction.LEND:
        return plan_lend(lease, view, now=now, superseded_by=ledger.superseded_by)
    return plan_reclaim(lease, view, ledger=ledger, now=now, blocked=blocked, standby_wait=standby_wait)


# --------------------------------------------------------------------------- cluster-wide


def plan_tag_release(view: ClusterView, *, busy: Iterable[DeviceKey] = ()) -> tuple[TagChange, ...]:
    """Clear the tag of every GPU a pod of its tag's owner holds (it is back with the owner).

    ``busy``: GPUs to leave alone (targets of unfinished leases, which clear their own tags).
    """
    skip = set(busy)
    back = [
        g.key
        for g in view.gpus.values()
        if g.owner is not None and g.key not in skip and g.holder is not None and g.holder.belongs_to(g.owner)
    ]
    return tuple(TagChange(key, None, leased_at=None) for key in sorted(back))


def spare_gpus(view: ClusterView) -> list[Gpu]:
    """Standby GPUs ready to supplement a reclaim: healthy, free and untagged."""
    return [
        g
        for g in view.gpus.values()
        if g.pool is Pool.STANDBY and not g.failed and g.free and g.owner is None and g.tier is not None
    ]


def free_node(gpus: Sequence[Gpu]) -> bool:
    """Every device of the node free and untagged, at least one healthy: it may change pools."""
    return bool(gpus) and all(g.free and g.owner is None for g in gpus) and any(not g.failed for g in gpus)


def node_model(gpus: Sequence[Gpu]) -> str:
    """A node's GPU model: its devices' most common model (ties: the first by name); ``""``
    when none is known."""
    models = [g.model for g in gpus if g.model is not None]
    return max(sorted(set(models)), key=models.count) if models else ""


def plan_standby(view: ClusterView, *, size: int) -> tuple[PoolChange, ...]:
    """Keep the standby pool at ``size`` spare GPUs (:func:`spare_gpus`), a whole node at a time.

    ``GPUNode.spec.pool`` is per node, so the pool grows by moving *whole free* general nodes
    (every device free and untagged, at least one healthy) to standby until it holds at least
    ``size`` spare GPUs — the model least represented in the pool first, then the node with
    most HA, then MA GPUs, then by name — and shrinks by moving whole free standby nodes back
    to general while it keeps at least ``size`` (lowest tiers first). ``size == 0`` leaves
    the pool alone.
    """
    if size <= 0:
        return ()
    spare = spare_gpus(view)
    pool_size = len(spare)
    by_model: dict[str, int] = {}
    for g in spare:
        by_model[g.model or ""] = by_model.get(g.model or "", 0) + 1
    changes: list[PoolChange] = []

    def healthy(gpus: Sequence[Gpu]) -> list[Gpu]:
        return [g for g in gpus if not g.failed and g.tier is not None]

    def tiers(gpus: Sequence[Gpu]) -> tuple[int, int]:
        return (sum(1 for g in gpus if g.tier is Tier.HA), sum(1 for g in gpus if g.tier is Tier.MA))

    nodes = {name: view.node_gpus(name) for name in sorted(view.pools)}
    if pool_size < size:
        candidates = [
            name for name, gpus in nodes.items() if view.pools[name] is Pool.GENERAL and free_node(gpus)
        ]
        while pool_size < size and candidates:
            best = min(
                candidates,
                key=lambda n: (
                    by_model.get(node_model(nodes[n]), 0),
                    -tiers(healthy(nodes[n]))[0],
                    -tiers(healthy(nodes[n]))[1],
                    n,
                ),
            )
            candidates.remove(best)
            gained = len(healthy(nodes[best]))
            changes.append(PoolChange(best, Pool.STANDBY, gpus=gained))
            pool_size += gained
            by_model[node_model(nodes[best])] = by_model.get(node_model(nodes[best]), 0) + gained
    elif pool_size > size:
        candidates = [
            name for name, gpus in nodes.items() if view.pools[name] is Pool.STANDBY and free_node(gpus)
        ]
        candidates.sort(key=lambda n: (tiers(healthy(nodes[n])), n))
        for name in candidates:
            count = len(healthy(nodes[name]))
            if pool_size - count >= size:
                changes.append(PoolChange(name, Pool.GENERAL, gpus=count))
                pool_size -= count
    return tuple(changes)
