"""flexlease.rightofreturn: the right-of-return invariants, from device identities, one
observation at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexlease.api.resources import DeviceKey, GPULease
from flexlease.rightofreturn import Audit, Outcome, Violation

OWNER = "online/rec"
T0 = datetime(2026, 3, 1, tzinfo=UTC)
A, B, C, S = DeviceKey("gpu-0", 0), DeviceKey("gpu-0", 1), DeviceKey("gpu-1", 0), DeviceKey("standby-0", 0)
NODES = ("gpu-0", "gpu-1", "standby-0")


def dev(key: DeviceKey, tier: str = "HA", **extra: Any) -> dict[str, Any]:
    return {"node": key.node, "index": key.index, "model": "NVIDIA H20", "tier": tier, **extra}


def lease(name: str, action: str, minute: int, *, count: int | None = None, **status: Any) -> GPULease:
    spec: dict[str, Any] = {"owner": OWNER, "action": action}
    if count is None:
        spec["devices"] = [{"node": "gpu-0", "index": 0}]
    else:
        spec["count"] = count
    return GPULease.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "online",
                "creationTimestamp": (T0 + timedelta(minutes=minute)).isoformat(),
            },
            "spec": spec,
            "status": status,
        }
    )


def lend(name: str, minute: int, *devices: dict[str, Any]) -> GPULease:
    return lease(name, "Lend", minute, phase="Done", lent=list(devices))


def reclaim(
    name: str, minute: int, phase: str, *targets: DeviceKey, count: int = 8, **status: Any
) -> GPULease:
    return lease(name, "Reclaim", minute, count=count, phase=phase, lent=[dev(t) for t in targets], **status)


def names(found: list[Violation]) -> list[str]:
    return [v.invariant for v in found]


def test_a_clean_cycle_has_no_violation_and_counts_every_lent_gpu_once() -> None:
    audit = Audit()
    tagged = {A: OWNER, B: OWNER, C: OWNER}
    lent = lend("lend-1", 0, dev(A), dev(B), dev(C))
    assert audit.observe([lent], tags=tagged, holders={C: OWNER}, nodes=NODES) == []
    assert audit.tally("online/lend-1").returned_early == 1  # the owner's pods took C back early
    rec = reclaim("reclaim-1", 10, "InProgress", A, B, count=2)
    assert audit.observe([lent, rec], tags={A: OWNER, B: OWNER}, holders={A: "lp/x"}, nodes=NODES) == []
    sup = [{"original": dev(B), "replacement": dev(S)}]
    done = reclaim("reclaim-1", 10, "Done", A, B, count=2, supplementedFromStandby=sup)
    assert audit.observe([lent, done], tags={}, holders={A: OWNER, S: OWNER}, nodes=NODES) == []
    tally = audit.tally("online/reclaim-1")
    assert (tally.lent, tally.back, tally.replaced, tally.unrecoverable, tally.still_lent) == (2, 1, 1, 0, 0)
    assert audit.tally("online/lend-1").claimed_by == {"online/reclaim-1": 2}
    assert audit.outcomes["online/reclaim-1"] == {A: Outcome.BACK, B: Outcome.REPLACED}
    assert audit.finished("online/reclaim-1") and audit.open_loans(OWNER) == []


def test_a_done_reclaim_whose_owner_lacks_a_target_is_a_violation() -> None:
    audit = Audit()
    lent = lend("lend-1", 0, dev(A), dev(B))
    audit.observe([lent], tags={A: OWNER, B: OWNER}, holders={}, nodes=NODES)
    done = reclaim("reclaim-1", 10, "Done", A, B, count=2)
    found = audit.observe([lent, done], tags={}, holders={A: OWNER}, nodes=NODES)
    assert names(found) == ["reclaim_done_without_gpus"]
    assert "gpu-0/1" in found[0].detail
    # reported once
    assert audit.observe([lent, done], tags={}, holders={A: OWNER}, nodes=NODES) == []


def test_unrecoverable_targets_end_the_loan_with_their_reason() -> None:
    audit = Audit()
    lent = lend("lend-1", 0, dev(A))
    gone = [{"node": "gpu-0", "index": 0, "reason": "NoStandbyOfModel"}]
    done = reclaim("reclaim-1", 10, "Done", A, count=1, unrecoverable=gone)
    assert audit.observe([lent, done], tags={}, holders={}, nodes=NODES) == []
    assert audit.tally("online/reclaim-1").unrecoverable_reasons == {"NoStandbyOfModel": 1}


def test_a_lent_gpu_left_untagged_while_out_is_a_violation() -> None:
    audit = Audit()
    lent = lend("lend-1", 0, dev(A), dev(S, in_kind=True))
    found = audit.observe([lent], tags={}, holders={}, nodes=NODES)
    assert names(found) == ["lent_gpu_untagged"]  # A; the in-kind standby GPU needs no tag
    assert "gpu-0/0" in found[0].detail
    # a GPU whose GPUNode is gone is exempt
    assert audit.observe([lend("lend-2", 1, dev(C))], tags={}, holders={}, nodes=("gpu-0",)) == []


def test_an_open_reclaims_target_must_keep_its_tag_until_back() -> None:
    audit = Audit()
    lent = lend("lend-1", 0, dev(A), dev(B))
    audit.observe([lent], tags={A: OWNER, B: OWNER}, holders={}, nodes=NODES)
    rec = reclaim("reclaim-1", 10, "InProgress", A, B, count=2)
    found = audit.observe([lent, rec], tags={A: OWNER}, holders={}, nodes=NODES)
    assert names(found) == ["lent_gpu_untagged"] and "gpu-0/1" in found[0].detail
    # held by the owner's pods: fine untagged
    assert audit.observe([lent, rec], tags={}, holders={A: OWNER, B: OWNER}, nodes=NODES) == []


def test_a_count_reclaim_that_leaves_lent_gpus_out_is_a_violation() -> None:
    """The overlap seen in #38: an older Reclaim still open claims a GPU the owner lends again;
    the next scale-up's Reclaim then takes fewer GPUs than were lent and is Done at once."""
    audit = Audit()
    tags = {A: OWNER, B: OWNER}
    lend1 = lend("lend-1", 0, dev(A), dev(B))
    old = reclaim("reclaim-1", 10, "InProgress", A, B, count=2)
    audit.observe([lend1, old], tags=tags, holders={}, nodes=NODES)
    lend2 = lend("lend-2", 20, dev(A), dev(B))
    new = reclaim("reclaim-2", 30, "Done", count=2)  # got nothing: A and B were claimed by reclaim-1
    found = audit.observe([lend1, old, lend2, new], tags=tags, holders={}, nodes=NODES)
    assert names(found) == ["reclaim_skipped_lent_gpus", "reclaim_skipped_lent_gpus"]
    assert "lent by online/lend-2" in found[0].detail


def test_a_cancelled_reclaim_hands_its_gpus_back_and_the_next_one_carries_them_in() -> None:
    audit = Audit()
    lend1 = lend("lend-1", 0, dev(A), dev(B), dev(C))
    rec1 = reclaim("reclaim-1", 10, "InProgress", A, B, C, count=3)
    audit.observe([lend1, rec1], tags={A: OWNER, B: OWNER, C: OWNER}, holders={}, nodes=NODES)
    audit.observe([lend1, rec1], tags={B: OWNER, C: OWNER, S: OWNER}, holders={A: OWNER}, nodes=NODES)
    sup = [{"original": dev(C), "replacement": dev(S)}]
    cancelled = reclaim(
        "reclaim-1",
        10,
        "Cancelled",
        A,
        B,
        C,
        count=3,
        supplementedFromStandby=sup,
        stillLent=[dev(B), dev(S)],
        supersededBy="lend-2",
    )
    lend2 = lend("lend-2", 20, dev(A))
    leases = [lend1, cancelled, lend2]
    assert audit.observe(leases, tags={A: OWNER, B: OWNER, S: OWNER}, holders={}, nodes=NODES) == []
    t1 = audit.tally("online/reclaim-1")
    assert (t1.back, t1.still_lent) == (1, 2)  # A came back before the cancel; B and C (as S) go on
    assert [loan.device for loan in audit.open_loans(OWNER)] == [A, B, S]
    rec2 = reclaim("reclaim-2", 30, "Done", A, B, S, count=3)
    assert audit.observe([*leases, rec2], tags={}, holders={A: OWNER, B: OWNER, S: OWNER}, nodes=NODES) == []
    t2 = audit.tally("online/reclaim-2")
    assert (t2.lent, t2.carried_in, t2.back) == (3, 2, 3)


def test_a_cancelled_reclaim_that_drops_a_target_loses_it() -> None:
    audit = Audit()
    lend1 = lend("lend-1", 0, dev(A), dev(B))
    audit.observe([lend1], tags={A: OWNER, B: OWNER}, holders={}, nodes=NODES)
    cancelled = reclaim("reclaim-1", 10, "Cancelled", A, B, count=2, stillLent=[dev(A)])
    found = audit.observe([lend1, cancelled], tags={A: OWNER, B: OWNER}, holders={}, nodes=NODES)
    assert names(found) == ["reclaim_lost_gpus"] and "gpu-0/1" in found[0].detail


def test_a_replacement_of_another_model_or_a_lower_tier_is_a_violation() -> None:
    audit = Audit()
    lend1 = lend("lend-1", 0, dev(A), dev(B))
    other = {"node": "standby-0", "index": 1, "model": "NVIDIA A100", "tier": "HA"}
    lower = dev(S, tier="MA")
    sups = [{"original": dev(A), "replacement": other}, {"original": dev(B), "replacement": lower}]
    rec = reclaim("reclaim-1", 10, "InProgress", A, B, count=2, supplementedFromStandby=sups)
    found = audit.observe(
        [lend1, rec], tags={DeviceKey("standby-0", 1): OWNER, S: OWNER}, holders={}, nodes=NODES
    )
    assert names(found) == ["replacement_mismatch", "replacement_mismatch"]


def test_a_gpu_lent_again_before_it_was_seen_back_ends_its_first_loan_as_returned_early() -> None:
    audit = Audit()
    audit.observe([lend("lend-1", 0, dev(A))], tags={A: OWNER}, holders={}, nodes=NODES)
    leases = [lend("lend-1", 0, dev(A)), lend("lend-2", 20, dev(A))]
    assert audit.observe(leases, tags={A: OWNER}, holders={}, nodes=NODES) == []
    assert audit.tally("online/lend-1").returned_early == 1
    assert [loan.lease for loan in audit.open_loans(OWNER)] == ["online/lend-2"]
