"""An owner's lend history, read from its GPULeases' status (no state of our own).

A Lend lease's ``status.lent`` records each GPU it lent with its model and tier *at lend
time* (``inKind`` for a standby GPU given back to the standby pool); a Reclaim lease's
``status.lent`` records the GPUs it takes back, and a Cancelled Reclaim's ``status.stillLent``
the ones that stay lent. Replaying an owner's leases in creation order (``creationTimestamp``,
then name) gives, per GPU, the lend-time record of GPUs still out on loan (needed to pick a
standby replacement of the same type and a tier >= the original's after the original failed,
was downgraded or vanished with its GPUNode), and the GPUs other unfinished Reclaims are
already taking back.

It also says how the lease being reconciled stands among its owner's others (DESIGN §2,
overlap): the newest directive wins, so a lease is *superseded* by the first newer lease of
the opposite action (a Lend by a Reclaim: the owner scales up again; a Reclaim by a Lend: it
scales down again); and a Reclaim takes its targets only once no older lease it depends on is
still settling (an unfinished Lend, or an unfinished Reclaim a newer Lend supersedes), so
that no lent GPU escapes it. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flexlease.api.resources import FINAL_PHASES, DeviceKey, GPULease, LeaseAction, LeaseDevice, LeasePhase

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FINISHED = FINAL_PHASES
"""Phases a lease never leaves (Done, Failed, Cancelled)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ledger:
    """``records``: GPUs lent and not yet covered by a Reclaim, with lend-time model/tier.
    ``claimed``: GPUs (targets and their standby replacements) of other unfinished Reclaims.
    For the excluded lease: ``superseded_by``, the name of the first newer lease of the
    opposite action (None: not superseded); ``waits_for``, the names of the older leases a
    Pending Reclaim waits for before it takes its targets."""

    records: Mapping[DeviceKey, LeaseDevice] = field(default_factory=dict)
    claimed: frozenset[DeviceKey] = frozenset()
    superseded_by: str | None = None
    waits_for: tuple[str, ...] = ()


def creation_order(lease: GPULease) -> tuple[datetime, str]:
    """The order an owner's leases are read in: creation time, then name."""
    return (lease.metadata.creation_timestamp or _EPOCH, lease.metadata.name)


def owner_ledger(leases: Iterable[GPULease], owner: str, *, exclude: str | None = None) -> Ledger:
    """Replay ``owner``'s leases (others are ignored) oldest first, skipping the one named
    ``exclude`` (the lease being reconciled; its supersession and waits are computed when it
    is among ``leases``). Never raises."""
    records: dict[DeviceKey, LeaseDevice] = {}
    claimed: set[DeviceKey] = set()
    mine = sorted((le for le in leases if le.spec.owner == owner), key=creation_order)
    for lease in mine:
        if lease.metadata.name == exclude:
            continue
        status = lease.status
        if lease.spec.action is LeaseAction.LEND:
            for device in status.lent:
                records[device.key] = device
            continue
        if status.phase is LeasePhase.PENDING:
            continue
        for device in status.lent:
            records.pop(device.key, None)
        if status.phase is LeasePhase.CANCELLED:
            for device in status.still_lent:
                records[device.key] = device
        elif status.phase not in FINISHED:
            claimed.update(d.key for d in status.lent)
            claimed.update(s.replacement.key for s in status.supplemented_from_standby)
    superseded_by, waits_for = _standing(mine, exclude)
    return Ledger(
        records=records, claimed=frozenset(claimed), superseded_by=superseded_by, waits_for=waits_for
    )


def _standing(mine: list[GPULease], name: str | None) -> tuple[str | None, tuple[str, ...]]:
    """Supersession and waits of the lease ``name`` among ``mine`` (one owner's, oldest
    first). A Failed lease (an invalid directive) supersedes nothing."""
    at = next((i for i, le in enumerate(mine) if le.metadata.name == name), None)
    if at is None:
        return None, ()
    me = mine[at]
    action = me.spec.action
    superseded_by = next(
        (
            le.metadata.name
            for le in mine[at + 1 :]
            if le.spec.action is not action and le.status.phase is not LeasePhase.FAILED
        ),
        None,
    )
    if action is LeaseAction.LEND:
        return superseded_by, ()
    waits: list[str] = []
    for i, older in enumerate(mine[:at]):
        if older.status.phase in FINISHED:
            continue
        if older.spec.action is LeaseAction.LEND:
            waits.append(older.metadata.name)
        elif any(le.spec.action is LeaseAction.LEND for le in mine[i + 1 : at]):
            waits.append(older.metadata.name)  # a newer Lend cancels it: wait for its stillLent
    return superseded_by, tuple(waits)
