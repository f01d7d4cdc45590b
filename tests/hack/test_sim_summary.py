"""hack/sim_summary.py: mean and spread over seeds; failed runs are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack import sim_summary
from tests.sim.test_report import _section


def _run(seed: int, share: float) -> dict[str, Any]:
    return {
        "scenario": {"seed": seed},
        "policies": {"ror": _section("ror", share), "plain": _section("plain", 0.5)},
    }


def test_table_gives_mean_and_range_per_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for seed, share in ((1, 0.75), (2, 0.875)):
        path = tmp_path / f"r{seed}.json"
        path.write_text(json.dumps(_run(seed, share)))
        paths.append(str(path))
    assert sim_summary.main(paths) == 0
    out = capsys.readouterr().out
    assert "| | right-of-return | plain leasing |" in out
    assert "| job HA share at start | 81.2 % (75.0–87.5) | 50.0 % (50.0–50.0) |" in out
    assert "over seeds 1, 2" in out
    # right-of-return's accounting per lent GPU; plain leasing lends nothing
    assert "| lent GPUs reclaimed as the same GPU | 84.6 % (84.6–84.6) | 84.6 % (84.6–84.6) |" in out
    assert "| lent GPUs lost | 0 | 0 |" in out


def test_a_failed_run_is_not_evidence() -> None:
    bad = _run(3, 0.75)
    bad["policies"]["plain"]["invariants"]["total"] = 2
    with pytest.raises(ValueError, match="not evidence"):
        sim_summary.table([_run(1, 0.75), bad])
    other = _run(4, 0.75)
    del other["policies"]["plain"]
    with pytest.raises(ValueError, match="same policies"):
        sim_summary.table([_run(1, 0.75), other])


def test_inputs_note_puts_measured_beside_targets() -> None:
    runs = []
    for seed, measured in ((1, 0.68), (2, 0.70)):
        run = _run(seed, 0.75)
        run["inputs"] = {
            "failure_model": {
                "calibration": {"target_no_outage_14d": 0.7, "target_no_outage_30d": 0.58},
                "measured": {"no_outage_14d": measured, "no_outage_30d": None},
            },
            "lp_daily_phase": {"method": "aligned to the tide", "shift_hours": 7.333},
        }
        runs.append(run)
    assert sim_summary.inputs_note(runs) == (
        "GPUs without an outage over 14 days: measured 69.0 % (target 70 %);"
        " LP arrivals: aligned to the tide, shift 7.333 h"
    )
    assert sim_summary.inputs_note([_run(1, 0.75)]) == ""


def test_accounting_counts_every_lent_gpu_of_the_closed_cycles_once() -> None:
    run = _run(2, 0.75)
    cycle = {
        "up_at": 10.0,
        "closed": True,
        "complete": False,
        "lent": 10,
        "lent_tagged": 8,
        "lent_in_kind": 2,
        "carried_in": 1,
        "earlier_loans": 0,
        "returned_before_reclaim": 1,
        "reclaimed_same": 6,
        "supplemented": 2,
        "unrecoverable": 1,
        "unrecoverable_reasons": {"NoStandbyOfModel": 1},
        "still_lent": 1,
        "lost": 0,
    }
    run["policies"]["ror"]["cycles"] = [cycle, {"up_at": 20.0, "closed": False}, {"up_at": None}]
    run["policies"]["ror"]["invariants"]["checks"] = 99
    lines = sim_summary.accounting([run]).splitlines()
    assert lines[0].startswith("| seed | cycles closed / all (complete) |")
    assert len(lines[1].split("|")) == len(lines[0].split("|"))
    assert (
        lines[2] == "| 2 | 1 / 2 (0) | 8 / 2 | 1 | 1 | 6 | 2 | 1 (NoStandbyOfModel 1) | 1 | 0 | 0 | 0 (99) |"
    )
    cycle["reclaimed_same"] = 5  # one GPU counted nowhere
    assert "| 1 | 0 (99) |" in sim_summary.accounting([run]).splitlines()[2]
