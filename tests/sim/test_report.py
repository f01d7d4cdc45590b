"""flexlease.sim.report: JSON, PNG plots and the table from a report of the runner's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flexlease.sim import report

DAY = 86400.0


def _section(policy: str, share: float) -> dict[str, Any]:
    samples = [
        {
            "t": h * 3600.0,
            "job_gpus": 16,
            "job_ha": round(16 * share),
            "job_ha_share": round(16 * share) / 16,
            "cluster_ha_share": 0.7,
            "static_ha_share": 0.8,
            "full": h % 24 > 6,
            "job_standby_gpus": 0,
            "standby_in_use": 0,
            "lp_running_gpus": 3,
        }
        for h in range(72)
    ]
    return {
        "policy": policy,
        "invariants": {"checks": 72, "violations": {}, "total": 0, "first": {}},
        "ha_share": {
            "start": share,
            "first_days_mean": share,
            "last_days_mean": share,
            "cluster_last_days_mean": 0.7,
            "static_last_days_mean": 0.8,
        },
        "lp_fulfilment": {
            "overall": 0.5,
            "trough_00_06": 0.6,
            "rest_06_24": 0.45,
            "by_hour_of_day": [0.5] * 23 + [None],
            "requests": 10,
            "days": 2.0,
            "requested_gpus_by_hour": [4] * 23 + [0],
            "granted_gpus_by_hour": [2] * 23 + [0],
        },
        "reclaim": {
            "cycles": 3,
            "closed_cycles": 3,
            "complete_cycles": 3,
            "lent_tagged": 12,
            "lent_in_kind": 1,
            "lent_untagged": 0,
            "carried_in": 0,
            "returned_before_reclaim": 0,
            "reclaimed_same": 11,
            "supplemented": 1,
            "unrecoverable": 0,
            "still_lent": 0,
            "lost": 0,
            "same_devices_back": 24,
            "released_gpus": 24,
            "reclaim_s_mean": 30.0,
            "reclaim_s_max": 40.0,
            "restore_delay_s_mean": 600.0,
            "restore_delay_s_max": 1200.0,
        },
        "standby": {"max_job_standby_gpus": 1, "max_standby_in_use": 1, "final_job_standby_gpus": 1},
        "scheduling": {
            "cycles": 100,
            "http_errors": 0,
            "double_allocations": 0,
            "assignment_mismatches": 0,
            "lp_pods_evicted_by_controller": 2,
            "preempted_lp_pods": 0,
            "lp_jobs_completed": 5,
            "lp_jobs_withdrawn": 1,
            "lp_resubmissions": 2,
        },
        "job": {"restarts": 4, "interruption_hours": 0.1, "pods_killed_by_gpu_failures": 1},
        "samples": samples,
    }


def _report() -> dict[str, Any]:
    return {"policies": {"ror": _section("ror", 0.875), "plain": _section("plain", 0.75)}}


def test_write_json_and_plots(tmp_path: Path) -> None:
    data = _report()
    path = report.write_json(data, tmp_path)
    assert json.loads(path.read_text())["policies"]["ror"]["policy"] == "ror"
    paths = report.plot(data, tmp_path)
    assert [p.name for p in paths] == ["ha_share.png", "lp_fulfilment.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 10_000


def test_table_has_a_column_per_policy_and_reports_errors() -> None:
    data = _report()
    data["policies"]["plain"] = {"policy": "plain", "error": "extender did not listen"}
    text = report.table(data)
    lines = text.splitlines()
    assert lines[0] == "| | right-of-return | plain leasing |"
    assert "| HA share of the job at start | 87.5 % | error |" in lines
    assert (
        "| lent GPUs back before the reclaim / same GPU / supplemented / unrecoverable / still lent"
        " / left on loan / lost | 0 / 11 / 1 / 0 / 0 / 0 / 0 | error |"
    ) in lines
    assert "| scale-up cycles (complete / closed / all) | 3 / 3 / 3 | error |" in lines
    assert lines[-1] == "ERROR plain: extender did not listen"


def test_daily_means_only_at_full_size() -> None:
    xs, ys = report._daily(_section("ror", 0.5)["samples"], "job_ha_share", full_only=True)
    assert xs == [0.5, 1.5, 2.5]
    assert ys == [0.5, 0.5, 0.5]
