"""Compare who sizes the online job over simulator reports (``report.json`` of
``python -m flexlease.sim --policy ror [--autopilot MODE]``), one Markdown row per configuration:
mean and spread (min–max) over the runs (seeds) given for it.

    python -m hack.autopilot_summary "tide=out/a/tide-1/report.json,out/a/tide-2/report.json" \\
        "reactive=out/a/prometheus-1/report.json,..."

Columns (after the warm-up, per tick): the share of time the job held fewer GPUs than its demand
(``ceil`` of the trace), the GPU-hours below and above the demand, the job's interruptions (scale
events and pods lost: count, hours), GPU-hours released (the job's peak less what it held) and of
those lent with a right of return (tagged for the job: HA and MA GPUs), LP fulfilment, idle
standby GPU-hours, the share of Reclaims fully served, and the invariant checks with their
violations. A run with an error is refused (exit status 1); violations are shown, never hidden.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

from hack.standby_summary import Groups, Metric, policy_of, rows, run

PEAK: Final = "_peak_gpus"
"""Where :func:`table` puts the job's peak allocation (``scenario.job_gpus``) in a section."""


def _released(p: dict[str, Any]) -> float:
    """GPU-hours the job did not hold below its peak: its peak × the hours less what it held."""
    demand = p["demand"]
    return round(float(p[PEAK]) * float(demand["hours"]) - float(demand["held_gpu_hours"]), 1)


def _served(p: dict[str, Any]) -> float | None:
    cycles = int(p["reclaim"]["cycles"])
    return p["reclaim"]["complete_cycles"] / cycles if cycles else None


COLUMNS: Final[list[tuple[str, Metric, str]]] = [
    ("time below demand", lambda p: p["demand"]["below_share"], "pct"),
    ("GPU-h below demand", lambda p: p["demand"]["below_gpu_hours"], "int"),
    ("GPU-h above demand", lambda p: p["demand"]["above_gpu_hours"], "int"),
    ("interruptions", lambda p: p["job"]["restarts"], "int"),
    ("interrupted h", lambda p: p["job"]["interruption_hours"], "float"),
    ("GPU-h released", _released, "int"),
    ("GPU-h lent (tagged)", lambda p: p["demand"]["lent_gpu_hours"], "int"),
    ("LP fulfilment", lambda p: p["lp_fulfilment"]["overall"], "pct"),
    ("idle standby GPU-h", lambda p: p["standby"]["idle_gpu_hours"], "int"),
    ("Reclaims fully served", _served, "pct"),
]


def _section(report: dict[str, Any]) -> dict[str, Any]:
    """The report's ``ror`` section with the job's peak under :data:`PEAK`. Raises
    ``ValueError`` for a report without the ``demand`` section (a simulator before issue #40)."""
    section = {**policy_of(report), PEAK: report["scenario"]["job_gpus"]}
    if "demand" not in section:
        raise ValueError("a report without the demand section (simulator before issue #40)")
    return section


def table(groups: Groups) -> str:
    """The Markdown table: one row per (label, reports of its seeds)."""
    return rows(groups, COLUMNS, first="sizing", section=_section)


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv, prog="autopilot_summary", doc=__doc__ or "", render=table)


if __name__ == "__main__":
    sys.exit(main())
