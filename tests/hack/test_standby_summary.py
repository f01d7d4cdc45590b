"""hack/standby_summary: one Markdown row per standby configuration, mean and spread over the
seeds, failed runs refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack import standby_summary


def _report(
    cycles: int, complete: int, idle: int, *, violations: int = 0, error: str | None = None
) -> dict[str, Any]:
    section: dict[str, Any] = {
        "reclaim": {"cycles": cycles, "complete_cycles": complete, "supplemented": 1, "unrecoverable": 2},
        "standby": {"idle_gpu_hours": idle},
        "lp_fulfilment": {"overall": 0.5},
        "job": {"interruption_hours": 0.25},
        "invariants": {"total": violations, "checks": 100},
    }
    if error:
        section["error"] = error
    return {"policies": {"ror": section}}


def test_rows_give_mean_and_spread_and_count_violations() -> None:
    text = standby_summary.table(
        [("fixed", [_report(4, 4, 100), _report(4, 2, 300)]), ("adaptive", [_report(0, 0, 10, violations=1)])]
    )
    lines = text.splitlines()
    assert lines[0].startswith("| standby pool | runs | Reclaims | fully served |")
    assert (
        lines[2]
        == "| fixed | 2 | 4 | 75.0 % (50.0 %–100.0 %) | 1 | 2 | 200 (100–300) | 50.0 % | 0.25 | 0 / 200 |"
    )
    assert lines[3] == "| adaptive | 1 | 0 | – | 1 | 2 | 10 | 50.0 % | 0.25 | 1 / 100 |"


def test_a_failed_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(1, 1, 1, error="extender gone")))
    assert standby_summary.main([f"fixed={path}"]) == 1
    assert "extender gone" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        standby_summary.main(["no-label"])
