"""flexlease.sim.runner + driver end to end: the simulator plays kube-scheduler against the real
extender (hosted in-process on loopback HTTP, on the simulation's virtual clock) over a
MemoryStore (small cluster, about a day and a half); and the same arguments give the same
report, byte for byte, across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from flexlease.sim import runner
from flexlease.sim.metrics import OUTCOMES
from flexlease.sim.scenario import Policy, Scenario

DAY = 86400.0
REPO = Path(__file__).resolve().parents[2]


def _scenario(tmp_path: Path, **overrides: Any) -> Scenario:
    values: dict[str, Any] = {
        "nodes": 4,
        "standby_nodes": 1,
        "days": 1.5,
        "seed": 3,
        "data_dir": tmp_path / "no-data",  # no trace: synthetic LP arrivals
        "warmup": 0.25 * DAY,
    }
    values.update(overrides)
    return Scenario(**values)


def _sound(section: dict[str, Any]) -> None:
    """What must hold for any policy: it ran to the end, no invariant was violated, the
    extender answered every call with the protocol, and the job got back to full size."""
    assert "error" not in section, section.get("error")
    assert section["invariants"]["total"] == 0, section["invariants"]
    assert section["invariants"]["checks"] > 200
    sched = section["scheduling"]
    assert sched["http_errors"] == 0
    assert sched["bound_low"] > 0
    cycles = [c for c in section["cycles"] if c["up_at"] is not None]
    assert cycles, "the tide should have scaled the job down and up"
    assert all(c["restored_at"] is not None for c in cycles)
    assert section["ha_share"]["start"] is not None


async def test_both_policies_run_against_the_real_extender(tmp_path: Path) -> None:
    report, timing = await runner.run_all(
        _scenario(tmp_path), [Policy.ROR, Policy.PLAIN], tmp_path / "out", keep_state=True, check_shared=True
    )
    assert report["inputs"]["lp_source"].startswith("synthetic (MISSING")
    plain, ror = report["policies"]["plain"], report["policies"]["ror"]
    _sound(plain)
    assert all(c["lend_phase"] is None and c["lent_tagged"] == 0 for c in plain["cycles"])
    _sound(ror)
    assert ror["scheduling"]["controller_timeouts"] == 0, ror["notes"]
    cycles = [c for c in ror["cycles"] if c["up_at"] is not None]
    assert sum(c["lent_tagged"] for c in cycles) > 0
    for c in cycles:
        assert c["lend_phase"] == "Done" and c["reclaim_phase"] == "Done", c
        assert c["reclaim_s"] >= 30  # the grace period passed on the virtual clock
        assert c["closed"] and c["lost"] == 0 and c["complete"], c
        back = c["returned_before_reclaim"] + c["reclaimed_same"] + c["supplemented"]
        assert back == c["lent"] + c["carried_in"], c
        assert c["supplement_events"] is not None and c["supplement_events"] >= c["supplements_listed"]
    state = json.loads((tmp_path / "out" / "ror" / "state.json").read_text())
    assert {lease["metadata"]["name"] for lease in state["GPULease"]} >= {"lend-0001", "reclaim-0001"}
    assert timing["ror"]["http"]["bind"]["calls"] > 0 and timing["wall_s"] > 0
    assert 0 < timing["ror"]["cpu_s"] <= 1.5 * timing["ror"]["wall_s"] + 1  # one process: CPU ≈ wall
    failures = report["inputs"]["failure_model"]
    # measured over the 14 days before the horizon (the histories start 15 days before t = 0);
    # 30 days reach back further than the histories: not measured
    assert 0 < failures["measured"]["no_outage_14d"] <= 1 and failures["measured"]["no_outage_30d"] is None
    assert failures["calibration"]["target_no_outage_14d"] == 0.7


async def test_a_missing_lease_controller_is_reported_not_waited_for(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, days=1.0, lease_enabled=False)
    report, _ = await runner.run_all(scenario, [Policy.ROR], tmp_path / "out")
    section = report["policies"]["ror"]
    assert "error" not in section
    assert section["scheduling"]["controller_timeouts"] >= 1
    assert any("lease controller does not seem to run" in n for n in section["notes"])
    assert not (tmp_path / "out" / "ror" / "state.json").exists()  # only with keep_state


def _cli_run(out: Path, data: Path, hash_seed: str, jobs: int) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    args = ["--nodes", "6", "--standby-nodes", "2", "--days", "1", "--seed", "5", "--policy", "both"]
    args += ["--jobs", str(jobs)]
    models = "NVIDIA H20:0.67,NVIDIA H100 80GB HBM3:0.33"
    where = ["--out", str(out), "--data", str(data), "--log-level", "WARNING"]
    subprocess.run(
        [sys.executable, "-m", "flexlease.sim", *args, "--gpu-models", models, *where],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    return (out / "report.json").read_bytes()


def test_same_seed_and_arguments_give_a_byte_identical_report(tmp_path: Path) -> None:
    """Two processes with different string hashing (set and dict orders differ) write the
    same report.json for right-of-return and plain leasing on a mixed H20/H100 cluster, one
    running the policies in turn, the other in two worker processes (``--jobs 2``)."""
    first = _cli_run(tmp_path / "a", tmp_path / "none", "1", jobs=1)
    second = _cli_run(tmp_path / "b", tmp_path / "none", "2", jobs=2)
    assert first == second
    report = json.loads(first)
    assert set(report["policies"]) == {"ror", "plain"}
    section = report["policies"]["ror"]
    assert section["invariants"]["total"] == 0
    assert section["reclaim"]["cycles"] >= 1


async def test_stress_tides_keep_right_of_return_at_the_edges(tmp_path: Path) -> None:
    """#38: irregular peaks and troughs (10 min to 6 h: back-to-back lend and reclaim), GPUs
    failing 6x as often (during lends too), a mixed H20/H100 cluster with one standby node of
    each model, a Reclaim waiting up to an hour for a standby GPU: the job lends standby
    supplements in kind, Reclaims are superseded by the next Lend and hand GPUs over to the
    next Reclaim, GPUs are supplemented or unrecoverable — and no invariant is violated, every
    lent GPU accounted by identity."""
    models = (("NVIDIA H20", 0.67), ("NVIDIA H100 80GB HBM3", 0.33))
    totals: dict[str, int] = {}
    for seed in (1, 7):
        scenario = _scenario(
            tmp_path,
            nodes=6,
            standby_nodes=2,
            days=2.0,
            seed=seed,
            tide_kind="irregular",
            failure_scale=6.0,
            standby_wait=3600.0,
            gpu_models=models,
        )
        report, _ = await runner.run_all(scenario, [Policy.ROR], tmp_path / f"out-{seed}")
        section = report["policies"]["ror"]
        assert "error" not in section and section["invariants"]["total"] == 0, section["invariants"]
        for c in section["cycles"]:
            if c["closed"]:
                ended = sum(c[k] for k in OUTCOMES)
                assert c["lost"] == 0 and ended == c["lent"] + c["carried_in"] + c["earlier_loans"], c
        for key, value in section["reclaim"].items():
            if isinstance(value, int):
                totals[key] = totals.get(key, 0) + value
    assert totals["lent_in_kind"] > 0 and totals["supplemented"] > 0
    assert totals["still_lent"] > 0 and totals["carried_in"] > 0 and totals["unrecoverable"] > 0
    assert totals["lost"] == 0 and totals["closed_cycles"] >= totals["cycles"] - 2


async def test_the_adaptive_standby_pool_sizes_itself_from_the_reclaims_shortfalls(tmp_path: Path) -> None:
    """``lease.standby.mode: adaptive`` in the hosted extender: with no Reclaim history the pool
    starts at its floor (0), so the two standby nodes set up go back to general and a Reclaim
    finds no standby GPU (a lent GPU unrecoverable); that shortfall makes the target > 0 and a
    node joins the pool again. Right-of-return's invariants hold throughout."""
    scenario = _scenario(
        tmp_path,
        nodes=6,
        standby_nodes=2,
        days=2.0,
        seed=1,
        tide_kind="irregular",
        failure_scale=6.0,
        standby_mode="adaptive",
    )
    report, _ = await runner.run_all(scenario, [Policy.ROR], tmp_path / "out", keep_state=True)
    section = report["policies"]["ror"]
    assert "error" not in section and section["invariants"]["total"] == 0, section["invariants"]
    standby, reclaim = section["standby"], section["reclaim"]
    assert standby["mode"] == "adaptive"
    hours = (scenario.horizon - scenario.warmup) / 3600
    assert standby["idle_gpu_hours"] < 16 * hours / 2  # the fixed pool keeps 16 GPUs idle all along
    assert reclaim["unrecoverable"] + reclaim["supplemented"] > 0
    assert standby["final_idle_gpus"] > 0  # grown back after the shortfall
    state = json.loads((tmp_path / "out" / "ror" / "state.json").read_text())
    moves = [e["message"] for e in state["Event"] if e["reason"] == "StandbyPool"]
    assert any("left the standby pool" in m for m in moves)
    assert any("joined the standby pool" in m and "Reclaim shortfall" in m for m in moves)


async def test_the_real_autopilot_sizes_the_job_and_the_job_follows_its_leases(tmp_path: Path) -> None:
    """``--autopilot prometheus`` (issue #40): the hosted extender runs the real lease autopilot,
    reading the demand trace (tide + noise + surprise peaks) through the simulation's metrics
    source. Every GPULease is the autopilot's (labelled with its policy; the tide policy wrote
    none), each Lend of N released exactly N GPUs of the job and each Reclaim of N raised its
    size by N, right-of-return's invariants hold at every step, and the same seed gives the
    same report, byte for byte."""
    scenario = _scenario(
        tmp_path, days=1.5, autopilot="prometheus", demand_noise=0.1, surprise_peaks=1.0, seed=4
    )
    report, _ = await runner.run_all(scenario, [Policy.ROR], tmp_path / "out", keep_state=True)
    section = report["policies"]["ror"]
    assert "error" not in section, section.get("error")
    assert section["invariants"]["total"] == 0, section["invariants"]
    assert section["invariants"]["checks"] > 200
    demand = section["demand"]
    assert demand["sizing"] == "autopilot:prometheus"
    assert demand["policy_lends"] > 0 and demand["policy_reclaims"] > 0, demand
    assert demand["lent_gpu_hours"] > 0 and demand["held_gpu_hours"] < scenario.job_gpus * demand["hours"]

    state = json.loads((tmp_path / "out" / "ror" / "state.json").read_text())
    leases = state["GPULease"]
    assert leases and all(
        lease["metadata"]["labels"]["flexlease.io/policy"] == "trainer" for lease in leases
    ), "every lease is the autopilot's"
    counts = {
        f"online/{lease['metadata']['name']}": (lease["spec"]["action"], lease["spec"]["count"])
        for lease in leases
    }
    lends = [c for c in section["cycles"] if c["lend"] is not None]
    assert lends and all(c["released"] == counts[c["lend"]][1] for c in lends)
    assert sum(n for action, n in counts.values() if action == "Lend") >= demand["policy_lent_gpus"]
    reclaims = [c for c in section["cycles"] if c["reclaim"] is not None]
    assert reclaims and all(counts[c["reclaim"]][0] == "Reclaim" for c in reclaims)
    assert sum(n for a, n in counts.values() if a == "Reclaim") >= demand["policy_reclaimed_gpus"] > 0
    assert section["reclaim"]["lost"] == 0
    policy = state["GPULeasePolicy"][0]
    assert policy["status"]["demand"]["source"] in ("prometheus", "fallback")

    again, _ = await runner.run_all(scenario, [Policy.ROR], tmp_path / "again")
    assert json.dumps(again, sort_keys=True) == json.dumps(
        {**report, "policies": {"ror": {k: v for k, v in section.items() if k != "state_file"}}},
        sort_keys=True,
    )
