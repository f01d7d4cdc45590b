"""hack/autopilot_summary: one Markdown row per way of sizing the online job, mean and spread
over the seeds; failed runs and reports without the demand section refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack import autopilot_summary


def _report(below: float, restarts: int, *, violations: int = 0, demand: bool = True) -> dict[str, Any]:
    section: dict[str, Any] = {
        "reclaim": {"cycles": 4, "complete_cycles": 3},
        "standby": {"idle_gpu_hours": 10},
        "lp_fulfilment": {"overall": 0.5},
        "job": {"restarts": restarts, "interruption_hours": 0.5},
        "invariants": {"total": violations, "checks": 100},
    }
    if demand:
        section["demand"] = {
            "below_share": below,
            "below_gpu_hours": 12,
            "above_gpu_hours": 300,
            "lent_gpu_hours": 40,
            "hours": 10,
            "held_gpu_hours": 70,
        }
    return {"policies": {"ror": section}, "scenario": {"job_gpus": 8}}


def test_rows_give_mean_and_spread_and_count_violations() -> None:
    text = autopilot_summary.table(
        [("tide", [_report(0.0, 10), _report(0.02, 14)]), ("reactive", [_report(0.1, 80, violations=2)])]
    )
    lines = text.splitlines()
    assert lines[0].startswith("| sizing | runs | time below demand | GPU-h below demand |")
    assert lines[2] == (
        "| tide | 2 | 1.0 % (0.0 %–2.0 %) | 12 | 300 | 12 (10–14) | 0.50 | 10 | 40 | 50.0 % | 10 | 75.0 % | 0 / 200 |"
    )
    assert lines[3].endswith("| 2 / 100 |")


def test_failed_or_old_reports_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_report(0.0, 1, demand=False)))
    assert autopilot_summary.main([f"tide={old}"]) == 1
    assert "demand section" in capsys.readouterr().err
    failed = _report(0.0, 1)
    failed["policies"]["ror"]["error"] = "extender gone"
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(failed))
    assert autopilot_summary.main([f"tide={path}"]) == 1
    assert "extender gone" in capsys.readouterr().err
    assert autopilot_summary.main([f"tide={tmp_path / 'missing.json'}"]) == 1
    with pytest.raises(SystemExit):
        autopilot_summary.main(["no-label"])
