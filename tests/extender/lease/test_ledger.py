"""An owner's lend history from its GPULeases (extender/lease/ledger.py)."""

from __future__ import annotations

from datetime import timedelta

from extender.lease.ledger import owner_ledger
from flexlease.api.resources import DeviceKey, parse_gpulease
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
