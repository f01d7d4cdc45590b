"""flexlease.sim.runner + driver end to end: the simulator plays kube-scheduler against the real
extender subprocess on a shared SQLite store (small cluster, about a day and a half)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flexlease.sim import runner
from flexlease.sim.scenario import Policy, Scenario

DAY = 86400.0


def _scenario(tmp_path: Path, **overrides: Any) -> Scenario:
    values: dict[str, Any] = {
        "nodes": 4,
        "standby_nodes": 1,
        "days": 1.5,
        "seed": 3,
        "data_dir": tmp_path / "no-data",  # no trace: synthetic LP arrivals
        "warmup": 0.25 * DAY,
        "lend_timeout_wall_s": 20.0,
        "reclaim_timeout_wall_s": 30.0,
    }
    values.update(overrides)
    return Scenario(**values)


def _sound(section: dict[str, Any]) -> None:
    """What must hold for any policy: it ran to the end, the extender answered every call
    with the protocol, no GPU went to two pods, and the job got back to full size each time."""
    assert "error" not in section, section.get("error")
    sched = section["scheduling"]
    assert sched["http_errors"] == 0
    assert sched["double_allocations"] == 0
    assert sched["assignment_mismatches"] == 0
    assert sched["bound_low"] > 0
    cycles = [c for c in section["cycles"] if c["up_at"] is not None]
    assert cycles, "the tide should have scaled the job down and up"
    assert all(c["restored_at"] is not None for c in cycles)
    assert section["ha_share"]["start"] is not None


async def test_plain_leasing_runs_against_the_real_extender(tmp_path: Path) -> None:
    report = await runner.run_all(_scenario(tmp_path), [Policy.PLAIN], tmp_path / "out")
    assert report["inputs"]["lp_source"].startswith("synthetic (MISSING")
    section = report["policies"]["plain"]
    _sound(section)
    assert all(c["lend_phase"] is None and c["lent_tagged"] == 0 for c in section["cycles"])
    assert (tmp_path / "out" / "plain" / "extender.log").exists()
    assert not (tmp_path / "out" / "plain" / "state.db").exists()  # removed unless keep_state


async def test_right_of_return_reclaims_every_lent_gpu(tmp_path: Path) -> None:
    report = await runner.run_all(_scenario(tmp_path), [Policy.ROR], tmp_path / "out")
    section = report["policies"]["ror"]
    _sound(section)
    assert section["scheduling"]["controller_timeouts"] == 0, section["notes"]
    cycles = [c for c in section["cycles"] if c["up_at"] is not None]
    assert sum(c["lent_tagged"] for c in cycles) > 0
    for c in cycles:
        assert c["lend_phase"] == "Done", c
        assert c["reclaim_phase"] == "Done", c
        assert c["missing"] == 0 and c["complete"], c
        assert c["reclaimed_same"] + c["supplemented"] == c["lent_tagged"]


async def test_a_missing_lease_controller_is_reported_not_waited_for(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, days=1.0, lend_timeout_wall_s=2.0, reclaim_timeout_wall_s=2.0)
    report = await runner.run_all(
        scenario, [Policy.ROR], tmp_path / "out", extra_env={"FLEXLEASE_LEASE__ENABLED": "false"}
    )
    section = report["policies"]["ror"]
    assert "error" not in section
    assert section["scheduling"]["controller_timeouts"] >= 1
    assert any("lease controller does not seem to run" in n for n in section["notes"])
    assert report["wall_s"] < 120
