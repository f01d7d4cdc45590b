"""flexlease.sim.driver: inputs shared by both policies (trace, tide, outages), without a server."""

from __future__ import annotations

from pathlib import Path

from flexlease.api.resources import DeviceKey
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


async def test_a_scale_up_restored_while_its_reclaim_runs_counts_the_supplements_listed_so_far() -> None:
    """The job is full again before its Reclaim finished: the accounting then reads the
    Reclaim's status as it is (a standby supplement the job holds is supplemented, not
    missing)."""
    store = MemoryStore()
    clock = ManualClock(driver.EPOCH)
    scenario = Scenario(nodes=2, standby_nodes=1, days=1)
    sim = driver.Simulation(
        scenario,
        Policy.ROR,
        world=driver.build_world(scenario),
        store=store,
        client=None,  # type: ignore[arg-type]
        clock=clock,
        host=None,  # type: ignore[arg-type]
    )
    a, b, c = DeviceKey("gpu-000", 0), DeviceKey("gpu-000", 1), DeviceKey("standby-00", 0)

    def dev(d: DeviceKey) -> dict[str, object]:
        return {"node": d.node, "index": d.index}

    lease = {
        "apiVersion": "flexlease.io/v1alpha1",
        "kind": "GPULease",
        "metadata": {"name": "reclaim-0001", "namespace": driver.JOB_NAMESPACE},
        "spec": {"owner": driver.JOB_OWNER, "action": "Reclaim", "count": 2},
    }
    await store.create(Kind.GPULEASE, lease)
    await store.patch(
        Kind.GPULEASE,
        "reclaim-0001",
        {
            "status": {
                "phase": "InProgress",
                "lent": [dev(a), dev(b)],
                "supplementedFromStandby": [{"original": dev(b), "replacement": dev(c)}],
            }
        },
        namespace=driver.JOB_NAMESPACE,
        subresource="status",
    )
    sim.lend_lease = {"status": {"lent": [dev(a), dev(b)]}}
    sim.released = [a, b]
    sim.reclaim_name, sim.reclaim_started = "reclaim-0001", 0.0
    cycle = driver.metrics.Cycle(down_at=0.0, released=2, up_at=600.0, lent_tagged=2)
    sim.cycles.append(cycle)
    others = [DeviceKey("gpu-001", i) for i in range(scenario.job_gpus - 2)]
    sim.pods["u"] = driver.SimPod(
        name="trainer-1",
        namespace=driver.JOB_NAMESPACE,
        uid="u",
        obj={},
        gpus=scenario.job_gpus,
        high=True,
        created=0.0,
        seq=1,
        node="gpu-000",
        devices=(a, c, *others),
    )
    try:
        await sim.check_restored(1200.0)
        assert (cycle.restored_at, cycle.final) == (1200.0, True)
        assert (cycle.reclaimed_same, cycle.supplemented, cycle.missing) == (1, 1, 0)
    finally:
        await store.close()
