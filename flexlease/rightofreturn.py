"""Right-of-return invariants (DESIGN §2), checked from device identities. Pure; no I/O.

:class:`Audit` is shown, one observation at a time, every GPULease, the right-of-return tags of
the GPUNodes and the owner of the pod holding each GPU; the simulator observes after every
step and the lease controller's tests after every reconcile they wait for. Every GPU an owner
lends opens one *loan*, followed by its device identity until it ends as exactly one
:class:`Outcome`:

* ``returned_early``: the owner's pods held it again before a Reclaim claimed it;
* ``back``: a Reclaim claimed it and the owner's pods held it before the Reclaim ended;
* ``replaced``: the Reclaim's standby replacement for it was held by the owner's pods;
* ``unrecoverable``: the Reclaim listed it in ``status.unrecoverable``;
* ``still_lent``: a Cancelled Reclaim listed it (or its chosen replacement) in
  ``status.stillLent``: the loan goes on as that GPU and ends in a later Reclaim.

The invariants (each violation is reported once, by :meth:`Audit.observe`):

* ``reclaim_done_without_gpus``: a Reclaim is Done while one of its targets has no outcome
  (Done means exactly: every target back, replaced or unrecoverable);
* ``reclaim_lost_gpus``: a Reclaim ended Cancelled or Failed leaving a target with no outcome
  (not even ``still_lent``);
* ``lent_gpu_untagged``: a GPU lent with a tag (not in kind) and still out on loan or claimed
  by an open Reclaim, neither held by its owner's pods nor replaced nor unrecoverable, is not
  tagged for its owner;
* ``reclaim_skipped_lent_gpus``: a ``count`` Reclaim took fewer targets than it asked for
  while a loan of its owner opened before it was out and not among them (claimed by an older
  Reclaim, or ignored): a scale-up that silently loses GPUs;
* ``replacement_mismatch``: a standby replacement of another model than the lend-time model
  of the GPU it replaces, or of a lower tier than its lend-time tier.

Per lease, :meth:`Audit.tally` counts the loans and outcomes, so that per lend/reclaim cycle
``lent + carried in = returned early + back + replaced + unrecoverable + still lent`` can be
checked from identities (``carried in``: targets that a Cancelled Reclaim handed back).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from flexlease.api.resources import (
    FINAL_PHASES,
    DeviceKey,
    GPULease,
    LeaseAction,
    LeaseDevice,
    LeasePhase,
    Supplement,
)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

INVARIANTS: Final = (
    "reclaim_done_without_gpus",
    "reclaim_lost_gpus",
    "lent_gpu_untagged",
    "reclaim_skipped_lent_gpus",
    "replacement_mismatch",
)
"""The names :meth:`Audit.observe` reports under."""


class Outcome(enum.StrEnum):
    """How one loan ended (see the module docstring)."""

    RETURNED_EARLY = "returned_early"
    BACK = "back"
    REPLACED = "replaced"
    UNRECOVERABLE = "unrecoverable"
    STILL_LENT = "still_lent"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant (a name of :data:`INVARIANTS`) and what broke it."""

    invariant: str
    detail: str


@dataclass(frozen=True, slots=True)
class Loan:
    """A GPU out on loan: its ``owner``, the lease that opened the loan (a Lend, or a Cancelled
    Reclaim that handed it back), that lease's creation order, and the lend-time record."""

    device: DeviceKey
    owner: str
    lease: str
    order: tuple[datetime, str]
    record: LeaseDevice
    carried: bool = False
    """Opened by a Cancelled Reclaim's ``stillLent`` (the loan of an earlier Lend goes on)."""

    @property
    def in_kind(self) -> bool:
        """Lent back to the standby pool untagged (a standby supplement the owner lent)."""
        return bool(self.record.in_kind)


@dataclass(slots=True)
class Tally:
    """Counts for one lease. A Lend: ``lent`` (loans it opened), ``returned_early``,
    ``claimed`` (by a Reclaim). A Reclaim: ``lent`` (its targets), of which ``carried_in``
    were handed back by a Cancelled Reclaim, and the outcome of each target."""

    lent: int = 0
    carried_in: int = 0
    returned_early: int = 0
    claimed: int = 0
    back: int = 0
    replaced: int = 0
    unrecoverable: int = 0
    still_lent: int = 0
    unrecoverable_reasons: dict[str, int] = field(default_factory=dict)
    claimed_by: dict[str, int] = field(default_factory=dict)
    """A Lend: how many of its loans each Reclaim claimed."""

    @property
    def resolved(self) -> int:
        """Targets with an outcome (a Reclaim)."""
        return self.back + self.replaced + self.unrecoverable + self.still_lent


@dataclass(slots=True)
class _Claim:
    """An open Reclaim's target: the loan it ends (None: not a known loan) and whether the
    owner's pods were seen holding it or its replacement."""

    loan: Loan | None
    record: LeaseDevice
    back: bool = False
    replaced: bool = False


def lease_name(lease: GPULease) -> str:
    """``<namespace>/<name>`` of a lease (the key of :meth:`Audit.tally`)."""
    return f"{lease.metadata.namespace or ''}/{lease.metadata.name}"


def creation_order(lease: GPULease) -> tuple[datetime, str]:
    """The order leases of one owner are read in: creation time, then name."""
    return (lease.metadata.creation_timestamp or _EPOCH, lease.metadata.name)


class Audit:
    """The right-of-return invariants over a sequence of observations (see the module
    docstring). Create one per cluster; call :meth:`observe` after every step."""

    def __init__(self) -> None:
        self._loans: dict[DeviceKey, Loan] = {}
        self._claims: dict[str, dict[DeviceKey, _Claim]] = {}
        self._lent_seen: set[tuple[str, DeviceKey]] = set()
        self._supplements_seen: set[tuple[str, DeviceKey]] = set()
        self._finished: set[str] = set()
        self._tallies: dict[str, Tally] = {}
        self._reported: set[tuple[str, str]] = set()
        self.outcomes: dict[str, dict[DeviceKey, Outcome]] = {}
        """Per lease, the outcome of each loan it opened (a Lend) or each target (a Reclaim)."""

    def tally(self, lease: str) -> Tally:
        """The counts of the lease ``<namespace>/<name>`` (zeros when never seen)."""
        return self._tallies.get(lease) or Tally()

    def finished(self, lease: str) -> bool:
        """Whether the lease ``<namespace>/<name>`` was seen in a final phase."""
        return lease in self._finished

    def open_loans(self, owner: str) -> list[Loan]:
        """``owner``'s loans not yet claimed by a Reclaim, ordered by device."""
        return sorted((loan for loan in self._loans.values() if loan.owner == owner), key=lambda x: x.device)

    def claimed(self, lease: str) -> dict[DeviceKey, bool]:
        """An open Reclaim's targets, each with whether it is back (as itself or replaced)."""
        return {d: c.back or c.replaced for d, c in (self._claims.get(lease) or {}).items()}

    def observe(
        self,
        leases: Iterable[GPULease],
        *,
        tags: Mapping[DeviceKey, str],
        holders: Mapping[DeviceKey, str | None],
        nodes: Collection[str],
    ) -> list[Violation]:
        """Take one observation and return the violations seen for the first time.

        ``leases``: every GPULease (any owner, any order); ``tags``: each tagged GPU's owner
        (``GPUNode.spec.devices``); ``holders``: for each GPU a live pod holds, that pod's owner
        ``<ns>/<job>`` (None: no owner); ``nodes``: the names of the GPUNodes that exist (a GPU
        of a missing one is exempt from the tag check). Never raises."""
        out: list[Violation] = []
        ordered = sorted(leases, key=creation_order)
        for lease in ordered:
            name = lease_name(lease)
            if name in self._finished:
                continue
            if lease.spec.action is LeaseAction.LEND:
                self._lend(lease, name)
            else:
                self._reclaim(lease, name, holders, out)
        for loan in list(self._loans.values()):
            if holders.get(loan.device) == loan.owner:
                del self._loans[loan.device]
                self._tally(loan.lease).returned_early += 1
                self.outcomes.setdefault(loan.lease, {})[loan.device] = Outcome.RETURNED_EARLY
            elif not loan.in_kind and loan.device.node in nodes and tags.get(loan.device) != loan.owner:
                self._violate(
                    out,
                    "lent_gpu_untagged",
                    f"{loan.device} lent by {loan.lease} is untagged (tag {tags.get(loan.device)!r},"
                    f" owner {loan.owner}) while it is out on loan",
                )
        for lease in ordered:
            name = lease_name(lease)
            claims = self._claims.get(name)
            if claims is None:
                continue
            owner = lease.spec.owner
            sups = {s.original.key for s in lease.status.supplemented_from_standby}
            gone = {u.key for u in lease.status.unrecoverable}
            for device, claim in claims.items():
                if claim.back or claim.replaced or device in sups or device in gone or claim.record.in_kind:
                    continue
                if device.node in nodes and tags.get(device) != owner:
                    self._violate(
                        out,
                        "lent_gpu_untagged",
                        f"{device}, a target of the open Reclaim {name}, is untagged"
                        f" (tag {tags.get(device)!r}, owner {owner})",
                    )
        return out

    # ------------------------------------------------------------------ steps

    def _tally(self, lease: str) -> Tally:
        return self._tallies.setdefault(lease, Tally())

    def _violate(self, out: list[Violation], invariant: str, detail: str) -> None:
        if (invariant, detail) not in self._reported:
            self._reported.add((invariant, detail))
            out.append(Violation(invariant, detail))

    def _lend(self, lease: GPULease, name: str) -> None:
        owner = lease.spec.owner
        for device in lease.status.lent:
            mark = (name, device.key)
            if mark in self._lent_seen:
                continue
            self._lent_seen.add(mark)
            old = self._loans.get(device.key)
            if old is not None:  # lent again: the owner held it in between, unseen
                self._tally(old.lease).returned_early += 1
                self.outcomes.setdefault(old.lease, {})[old.device] = Outcome.RETURNED_EARLY
            self._loans[device.key] = Loan(device.key, owner, name, creation_order(lease), device)
            self._tally(name).lent += 1
        if lease.status.phase in FINAL_PHASES:
            self._finished.add(name)

    def _reclaim(
        self, lease: GPULease, name: str, holders: Mapping[DeviceKey, str | None], out: list[Violation]
    ) -> None:
        status = lease.status
        owner = lease.spec.owner
        if status.phase is LeasePhase.PENDING:
            return
        if name not in self._claims and (
            status.lent or status.phase in (LeasePhase.IN_PROGRESS, LeasePhase.DONE)
        ):
            self._accept(lease, name, out)
        claims = self._claims.get(name)
        if claims is None:  # Failed before it took targets
            if status.phase in FINAL_PHASES:
                self._finished.add(name)
            return
        sups = {s.original.key: s for s in status.supplemented_from_standby}
        for original, new in sups.items():
            mark = (name, original)
            if mark in self._supplements_seen:
                continue
            self._supplements_seen.add(mark)
            target = claims.get(original)
            record = target.record if target is not None else new.original
            rep = new.replacement
            wrong_model = record.model is not None and rep.model != record.model
            low_tier = record.tier is not None and (rep.tier is None or rep.tier < record.tier)
            if wrong_model or low_tier:
                self._violate(
                    out,
                    "replacement_mismatch",
                    f"{name}: {original} ({record.model}, {record.tier}) replaced by {rep.key}"
                    f" ({rep.model}, {rep.tier})",
                )
        for device, claim in claims.items():
            if holders.get(device) == owner:
                claim.back = True
            held = sups.get(device)
            if held is not None and holders.get(held.replacement.key) == owner:
                claim.replaced = True
        if status.phase not in FINAL_PHASES:
            return
        self._finished.add(name)
        del self._claims[name]
        tally = self._tally(name)
        gone = {u.key: u for u in status.unrecoverable}
        still = {d.key: d for d in status.still_lent}
        outcomes = self.outcomes.setdefault(name, {})
        for device, claim in sorted(claims.items()):
            sup: Supplement | None = sups.get(device)
            if claim.back:
                outcome = Outcome.BACK
                tally.back += 1
            elif claim.replaced:
                outcome = Outcome.REPLACED
                tally.replaced += 1
            elif device in gone:
                outcome = Outcome.UNRECOVERABLE
                tally.unrecoverable += 1
                reason = gone[device].reason
                tally.unrecoverable_reasons[reason] = tally.unrecoverable_reasons.get(reason, 0) + 1
            elif status.phase is LeasePhase.CANCELLED and (
                device in still or (sup is not None and sup.replacement.key in still)
            ):
                outcome = Outcome.STILL_LENT
                tally.still_lent += 1
                carried = still[device] if device in still or sup is None else still[sup.replacement.key]
                self._loans[carried.key] = Loan(
                    carried.key, owner, name, creation_order(lease), carried, carried=True
                )
            else:
                invariant = (
                    "reclaim_done_without_gpus" if status.phase is LeasePhase.DONE else "reclaim_lost_gpus"
                )
                self._violate(
                    out,
                    invariant,
                    f"{name} ended {status.phase.value} but {device} is neither held by {owner}'s pods"
                    f" nor replaced{f' (by {sup.replacement.key})' if sup else ''} nor unrecoverable"
                    + ("" if status.phase is LeasePhase.DONE else " nor still lent"),
                )
                continue
            outcomes[device] = outcome

    def _accept(self, lease: GPULease, name: str, out: list[Violation]) -> None:
        """The Reclaim's targets are fixed: each ends the loan on that GPU."""
        if name in self._claims:
            return
        owner = lease.spec.owner
        claims: dict[DeviceKey, _Claim] = {}
        tally = self._tally(name)
        for target in lease.status.lent:
            loan = self._loans.get(target.key)
            if loan is not None and loan.owner == owner:
                del self._loans[target.key]
                origin = self._tally(loan.lease)
                origin.claimed += 1
                origin.claimed_by[name] = origin.claimed_by.get(name, 0) + 1
                if loan.carried:
                    tally.carried_in += 1
            else:
                loan = None
            claims[target.key] = _Claim(loan, target)
        tally.lent = len(claims)
        self._claims[name] = claims
        count = lease.spec.count
        if count is not None and len(claims) < count:
            mine = creation_order(lease)
            for loan in self.open_loans(owner):
                if loan.order < mine:
                    self._violate(
                        out,
                        "reclaim_skipped_lent_gpus",
                        f"{name} asked for {count} GPUs and took {len(claims)}, leaving {loan.device}"
                        f" lent by {loan.lease} out on loan",
                    )
