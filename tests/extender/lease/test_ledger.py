"""An owner's lend history from its GPULeases (extender/lease/ledger.py)."""

from __future__ import annotations

from datetime import timedelta

from extender.lease.ledger import owner_ledger
from flexlease.api.resources import DeviceKey, GPULease, parse_gpulease
from flexlease.api.tiers import Tier
from tests.extender.lease.builders import H20, T0, lease

OWNER = "online/rec"


def test_ledger_replays_lends_and_claims_of_unfinished_reclaims() -> None:
    lend = parse_gpulease(
        {
            **lease("a", "Lend", devices=[("n1", 0), ("n1", 1)]),
            "status": {
                "phase": "Done",
                "lent": [
                    {"node": "n1", "index": 0, "model": H20, "tier": "HA"},
                    {"node": "n1", "index": 1, "model": H20, "tier": "MA"},
                ],
            },
        }
    )
    reclaim = parse_gpulease(
        {
            **lease("b", "Reclaim", count=1, created=T0 + timedelta(hours=1)),
            "status": {"phase": "InProgress", "lent": [{"node": "n1", "index": 0}]},
        }
    )
    other = parse_gpulease(
        {
            **lease("c", "Lend", owner="x/y", devices=[("n2", 0)]),
            "status": {"lent": [{"node": "n2", "index": 0}]},
        }
    )
    ledger = owner_ledger([reclaim, lend, other], OWNER)
    assert set(ledger.records) == {DeviceKey("n1", 1)} and ledger.records[DeviceKey("n1", 1)].tier is Tier.MA
    assert ledger.claimed == {DeviceKey("n1", 0)}
    assert owner_ledger([reclaim, lend], OWNER, exclude="b").claimed == frozenset()


def _at(name: str, action: str, minutes: int, **status: object) -> GPULease:
    kind = {"count": 2} if action == "Reclaim" else {"devices": [("n1", 0)]}
    obj = lease(name, action, created=T0 + timedelta(minutes=minutes), **kind)
    return parse_gpulease({**obj, "status": status})


def test_a_cancelled_reclaim_returns_what_stays_lent_to_the_records() -> None:
    record = {"model": H20, "tier": "HA"}
    lend = _at("a", "Lend", 0, phase="Done", lent=[{"node": "n1", "index": i, **record} for i in (0, 1)])
    cancelled = _at(
        "b",
        "Reclaim",
        10,
        phase="Cancelled",
        lent=[{"node": "n1", "index": i, **record} for i in (0, 1)],
        stillLent=[{"node": "s1", "index": 0, "inKind": True, **record}],
    )
    ledger = owner_ledger([lend, cancelled], OWNER)
    assert set(ledger.records) == {DeviceKey("s1", 0)} and ledger.records[DeviceKey("s1", 0)].in_kind
    assert ledger.claimed == frozenset()  # a finished Reclaim claims nothing


def test_the_newest_directive_supersedes_and_a_pending_reclaim_waits_for_what_settles() -> None:
    lend1 = _at("l1", "Lend", 0, phase="InProgress")
    rec1 = _at("r1", "Reclaim", 10)
    assert owner_ledger([lend1, rec1], OWNER, exclude="l1").superseded_by == "r1"
    assert owner_ledger([lend1, rec1], OWNER, exclude="r1").waits_for == ("l1",)
    # a Reclaim open when the owner lends again is superseded; the next Reclaim waits for it
    rec_open = _at("r1", "Reclaim", 10, phase="InProgress")
    lend2 = _at("l2", "Lend", 20, phase="Done")
    rec2 = _at("r2", "Reclaim", 30)
    leases = [_at("l1", "Lend", 0, phase="Done"), rec_open, lend2, rec2]
    assert owner_ledger(leases, OWNER, exclude="r1").superseded_by == "l2"
    assert owner_ledger(leases, OWNER, exclude="r2").waits_for == ("r1",)
    assert owner_ledger(leases, OWNER, exclude="l2").superseded_by == "r2"
    # two open Reclaims without a Lend between them do not wait for each other
    assert owner_ledger([rec_open, _at("r3", "Reclaim", 11)], OWNER, exclude="r3").waits_for == ()
    # a Failed lease (an invalid directive) supersedes nothing; ties in time go by name
    failed = _at("r9", "Reclaim", 40, phase="Failed")
    assert owner_ledger([lend2, failed], OWNER, exclude="l2").superseded_by is None
    same_second = [_at("b-lend", "Lend", 0), _at("a-reclaim", "Reclaim", 0)]
    assert owner_ledger(same_second, OWNER, exclude="a-reclaim").superseded_by == "b-lend"
