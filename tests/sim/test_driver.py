"""flexlease.sim.driver: inputs shared by both policies (trace, tide, outages), without a server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from flexlease.api.resources import DeviceKey, GPULease, Pool
from flexlease.clock import ManualClock
from flexlease.sim import driver, traces
from flexlease.sim.scenario import Policy, Scenario
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore

HEAD = "submit_time_s,gpus,duration_s,tenant,status,source_job_index,submit_time_local\n"


def _write_trace(data: Path) -> None:
    data.mkdir()
    rows = [f"{i * 900},{1 + i % 12},{3600 + i * 10},,,{i},x" for i in range(200)]
    (data / "jobs_philly.csv").write_text(HEAD + "\n".join(rows) + "\n")
    util = [f"{m * 600},{0.6 + (m % 144) / 1440},1,856,0,x" for m in range(144 * 3)]
    (data / "cluster_util_helios_earth_may2020_10min.csv").write_text(
        "time_s,mean_util,running_gpus,total_gpus,pending_gpus,time_local\n" + "\n".join(util) + "\n"
    )


def test_world_uses_the_trace_and_the_helios_shape_when_present(tmp_path: Path) -> None:
    _write_trace(tmp_path / "data")
    s = Scenario(nodes=4, standby_nodes=1, days=3, data_dir=tmp_path / "data")
    world = driver.build_world(s)
    assert world.lp_source.startswith("trace:")
    assert "shaped by" in world.tide_source
    assert world.arrivals and all(a.gpus <= 8 for a in world.arrivals)
    assert len(world.outages) == 5 * 8
    assert DeviceKey("standby-00", 7) in world.outages
    assert world.outages == driver.build_world(s).outages  # same seed, same failures


def test_world_falls_back_to_synthetic_arrivals_loudly(tmp_path: Path) -> None:
    s = Scenario(nodes=4, standby_nodes=0, days=2, data_dir=tmp_path)
    world = driver.build_world(s)
    assert world.lp_source.startswith("synthetic (MISSING")
    assert (
        world.tide_source
        == f"Fig. 2 cosine 0.39–0.92 (no {tmp_path / 'cluster_util_helios_earth_may2020_10min.csv'})"
    )
    assert world.arrivals


def test_iter_policies() -> None:
    assert list(driver.iter_policies("both")) == [Policy.ROR, Policy.PLAIN]
    assert list(driver.iter_policies("plain")) == [Policy.PLAIN]


def test_an_unclocked_trace_is_put_in_the_day_by_its_rhythm(tmp_path: Path) -> None:
    """Alibaba-like: jobs busy 02:00–08:00 of trace time every day; the tide peaks mid-afternoon,
    so the arrivals are shifted to put the busy hours there and the night quiet (Fig. 10)."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        f"{d * 86400 + m * 60},2,1800,,,0"
        for d in range(4)
        for m in range(0, 1440, 15)
        if 2 <= m // 60 < 8 or m % 240 == 0
    ]
    text = "submit_time_s,gpus,duration_s,tenant,status,source_job_index\n" + "\n".join(rows) + "\n"
    (data / "jobs_alibaba_crux2023.csv").write_text(text)
    s = Scenario(nodes=4, standby_nodes=1, days=4, data_dir=data, trace="alibaba")
    world = driver.build_world(s)
    phase = world.lp_phase
    assert phase["method"].startswith("aligned to the tide") and 8 <= phase["shift_hours"] <= 11
    night = sum(1 for a in world.arrivals if (a.time % 86400) < 6 * 3600)
    afternoon = sum(1 for a in world.arrivals if 10 * 3600 <= (a.time % 86400) < 16 * 3600)
    assert afternoon > 4 * night
    assert driver.lp_daily_phase("philly", traces.parse_jobs(text))[1]["method"] == "the trace's own clock"


async def test_supplement_events_are_counted_per_reclaim() -> None:
    """The Supplemented Events the lease controller writes about one Reclaim (other reasons,
    other leases and other kinds are not counted)."""
    store = MemoryStore()
    clock = ManualClock(driver.EPOCH)
    sim = driver.Simulation(
        Scenario(nodes=2, standby_nodes=0, days=1),
        Policy.ROR,
        world=driver.build_world(Scenario(nodes=2, standby_nodes=0, days=1)),
        store=store,
        client=None,  # type: ignore[arg-type]
        clock=clock,
        host=None,  # type: ignore[arg-type]
    )

    def event(name: str, reason: str, lease: str, kind: str = "GPULease") -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": driver.JOB_NAMESPACE},
            "involvedObject": {"kind": kind, "name": lease},
            "reason": reason,
        }

    for obj in (
        event("a", "Supplemented", "reclaim-0001"),
        event("b", "Supplemented", "reclaim-0001"),
        event("c", "ReclaimDone", "reclaim-0001"),
        event("d", "Supplemented", "reclaim-0002"),
        event("e", "Supplemented", "reclaim-0001", kind="Pod"),
    ):
        await store.create(Kind.EVENT, obj)
    try:
        assert await sim._supplement_events("reclaim-0001") == 2
    finally:
        await store.close()


def _lease(name: str, action: str, minute: int, *, count: int = 2, **status: object) -> GPULease:
    spec: dict[str, object] = {"owner": driver.JOB_OWNER, "action": action}
    if action == "Lend":
        spec["devices"] = [{"node": "gpu-000", "index": 0}]
    else:
        spec["count"] = count
    return GPULease.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": driver.JOB_NAMESPACE,
                "creationTimestamp": (driver.EPOCH + timedelta(minutes=minute)).isoformat(),
            },
            "spec": spec,
            "status": status,
        }
    )


def _record(d: DeviceKey) -> dict[str, object]:
    return {"node": d.node, "index": d.index, "model": "NVIDIA H20", "tier": "HA"}


def _holding_sim(devices: tuple[DeviceKey, ...], *, autopilot: str = "off") -> driver.Simulation:
    """A simulation (no extender) whose job holds ``devices`` and whose store watches have
    delivered every node (so the audit checks tags there)."""
    scenario = Scenario(nodes=2, standby_nodes=1, days=1, autopilot=autopilot)
    sim = driver.Simulation(
        scenario,
        Policy.ROR,
        world=driver.build_world(scenario),
        store=None,  # type: ignore[arg-type]
        client=None,  # type: ignore[arg-type]
        clock=ManualClock(driver.EPOCH),
        host=None,  # type: ignore[arg-type]
    )
    sim.pods["u"] = driver.SimPod(
        name="trainer-1",
        namespace=driver.JOB_NAMESPACE,
        uid="u",
        obj={},
        gpus=len(devices),
        high=True,
        created=0.0,
        seq=1,
        node=devices[0].node,
        devices=devices,
    )
    sim.held = dict.fromkeys(devices, "u")
    sim._watched_pools = {n: Pool.GENERAL for n in ("gpu-000", "gpu-001")} | {"standby-00": Pool.STANDBY}
    return sim


def test_a_cycle_is_accounted_per_gpu_from_identities_when_its_reclaim_finishes() -> None:
    """Lend A and B; the Reclaim takes both, B failed and is replaced by standby S: the cycle
    closes with 1 back, 1 supplemented, nothing lost, and no invariant violated."""
    a, b, s = DeviceKey("gpu-000", 0), DeviceKey("gpu-000", 1), DeviceKey("standby-00", 0)
    sim = _holding_sim((a, s))
    sim._lease_objs = {
        "online/lend-0001": _lease("lend-0001", "Lend", 0, phase="Done", lent=[_record(a), _record(b)]),
        "online/reclaim-0001": _lease(
            "reclaim-0001",
            "Reclaim",
            10,
            phase="Done",
            lent=[_record(a), _record(b)],
            supplementedFromStandby=[{"original": _record(b), "replacement": _record(s)}],
        ),
    }
    cycle = driver.metrics.Cycle(
        down_at=0.0, released=2, up_at=600.0, lend="online/lend-0001", reclaim="online/reclaim-0001"
    )
    cycle.lent_tagged = 2
    sim.cycles.append(cycle)
    sim.observe()
    assert cycle.closed and cycle.complete
    assert (cycle.reclaimed_same, cycle.supplemented, cycle.lost, cycle.balance()) == (1, 1, 0, 0)
    assert sim.invariants.total == 0, sim.invariants.as_dict()


def test_a_scale_up_that_leaves_lent_gpus_out_fails_the_run() -> None:
    """#38: the Reclaim is Done with one of the two lent GPUs (the other was claimed by an
    older Reclaim): the cycle loses it, counted as violations."""
    a, b = DeviceKey("gpu-000", 0), DeviceKey("gpu-000", 1)
    sim = _holding_sim((a,))
    sim._tags = {b: driver.JOB_OWNER}
    sim._lease_objs = {
        "online/lend-0001": _lease("lend-0001", "Lend", 0, phase="Done", lent=[_record(a), _record(b)]),
        "online/reclaim-0001": _lease("reclaim-0001", "Reclaim", 10, phase="Done", lent=[_record(a)]),
    }
    cycle = driver.metrics.Cycle(
        down_at=0.0, released=2, up_at=600.0, lend="online/lend-0001", reclaim="online/reclaim-0001"
    )
    cycle.lent_tagged = 2
    sim.cycles.append(cycle)
    sim.observe()
    assert cycle.closed and not cycle.complete and cycle.lost == 1
    counts = sim.invariants.counts
    assert counts["reclaim_skipped_lent_gpus"] == 1 and counts["cycle_unaccounted"] == 1


def test_under_the_autopilot_a_reclaim_may_leave_loans_out_and_they_are_accounted() -> None:
    """A Reclaim of the autopilot takes 1 of the 2 GPUs its cycle's Lend lent (the plan needs
    one more): the other stays out on loan, tagged for the job — ``left_on_loan``, not lost."""
    a, b = DeviceKey("gpu-000", 0), DeviceKey("gpu-000", 1)
    sim = _holding_sim((a,), autopilot="prometheus")
    assert sim.autopilot and sim.job_pod_gpus == 1
    sim._tags = {b: driver.JOB_OWNER}
    sim._lease_objs = {
        "online/lend-0001": _lease("lend-0001", "Lend", 0, phase="Done", lent=[_record(a), _record(b)]),
        "online/reclaim-0001": _lease(
            "reclaim-0001", "Reclaim", 10, count=1, phase="Done", lent=[_record(a)]
        ),
    }
    cycle = driver.metrics.Cycle(
        down_at=0.0, released=2, up_at=600.0, lend="online/lend-0001", reclaim="online/reclaim-0001"
    )
    cycle.lent_tagged = 2
    sim.cycles.append(cycle)
    sim.observe()
    assert cycle.closed and cycle.complete
    assert (cycle.reclaimed_same, cycle.left_on_loan, cycle.lost, cycle.balance()) == (1, 1, 0, 0)
    assert sim.invariants.total == 0, sim.invariants.as_dict()
