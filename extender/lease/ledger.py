"""An owner's lend history, read from its GPULeases' status (no state of our own).

A Lend lease's ``status.lent`` records each tagged GPU with its model and tier *at lend
time*; a Reclaim lease's ``status.lent`` records the GPUs it takes back. Replaying an owner's
leases in creation order gives, per GPU, the lend-time model and tier of GPUs still out on loan
(needed to pick a standby replacement of the same type and a tier >= the original's after the
original failed, was downgraded or vanished with its GPUNode), and the GPUs other unfinished
Reclaim leases are already taking back. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flexlease.api.resources import DeviceKey, GPULease, LeaseAction, LeaseDevice, LeasePhase

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FINISHED = frozenset({LeasePhase.DONE, LeasePhase.FAILED})


@dataclass(frozen=True, slots=True, kw_only=True)
class Ledger:
    """``records``: GPUs lent and not yet covered by a Reclaim, with lend-time model/tier.
    ``claimed``: GPUs (targets and their standby replacements) of other unfinished Reclaims."""

    records: Mapping[DeviceKey, LeaseDevice] = field(default_factory=dict)
    claimed: frozenset[DeviceKey] = frozenset()


def _order(lease: GPULease) -> tuple[datetime, str]:
    return (lease.metadata.creation_timestamp or _EPOCH, lease.metadata.name)


def owner_ledger(leases: Iterable[GPULease], owner: str, *, exclude: str | None = None) -> Ledger:
    """Replay ``owner``'s leases (others are ignored) oldest first, skipping the one named
    ``exclude`` (the lease being reconciled). Never raises."""
    records: dict[DeviceKey, LeaseDevice] = {}
    claimed: set[DeviceKey] = set()
    mine = sorted((le for le in leases if le.spec.owner == owner and le.metadata.name != exclude), key=_order)
    for lease in mine:
        status = lease.status
        if lease.spec.action is LeaseAction.LEND:
            for device in status.lent:
                records[device.key] = device
            continue
        if status.phase is LeasePhase.PENDING:
            continue
        for device in status.lent:
            records.pop(device.key, None)
        if status.phase not in FINISHED:
            claimed.update(d.key for d in status.lent)
            claimed.update(s.replacement.key for s in status.supplemented_from_standby)
    return Ledger(records=records, claimed=frozenset(claimed))
