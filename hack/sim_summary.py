"""Summarise several simulator reports (``report.json`` of ``python -m flexlease.sim``, one per
seed) as one Markdown table: per policy, the mean and the spread (min–max) over the runs.

    python -m hack.sim_summary [--accounting] out/philly-1/report.json out/philly-2/report.json ...

``--accounting`` adds right-of-return's per-cycle accounting, one row per run: every lent GPU
(and every GPU a Cancelled Reclaim carried over) counted by identity as exactly one of returned
before the reclaim, back, replaced from standby, unrecoverable (by reason) or still lent, and
the GPUs lost (none may be). Every run must have the same policies; a run with an error or an
invariant violation is refused (exit status 1), as its figures are not evidence.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from flexlease.sim.metrics import OUTCOMES

LABELS = {"ror": "right-of-return", "plain": "plain leasing", "static": "no scaling"}

Metric = Callable[[dict[str, Any]], float | None]

ROWS: list[tuple[str, Metric, str]] = [
    ("job HA share at start", lambda p: p["ha_share"]["start"], "pct"),
    ("job HA share, last 7 days (at peak)", lambda p: p["ha_share"]["last_days_mean"], "pct"),
    ("cluster HA share, last 7 days", lambda p: p["ha_share"]["cluster_last_days_mean"], "pct"),
    (
        "lent GPUs back before the reclaim",
        lambda p: _ratio(p["reclaim"]["returned_before_reclaim"], _lent(p)),
        "pct",
    ),
    (
        "lent GPUs reclaimed as the same GPU",
        lambda p: _ratio(p["reclaim"]["reclaimed_same"], _lent(p)),
        "pct",
    ),
    (
        "lent GPUs supplemented from standby",
        lambda p: _ratio(p["reclaim"]["supplemented"], _lent(p)),
        "pct",
    ),
    ("lent GPUs unrecoverable", lambda p: _count(p, "unrecoverable"), "int"),
    ("lent GPUs still lent (Reclaim cancelled)", lambda p: _count(p, "still_lent"), "int"),
    ("lent GPUs lost", lambda p: _count(p, "lost"), "int"),
    ("job interruption (h)", lambda p: p["job"]["interruption_hours"], "num"),
    ("LP fulfilment 00–06", lambda p: p["lp_fulfilment"]["trough_00_06"], "pct"),
    ("LP fulfilment 06–24", lambda p: p["lp_fulfilment"]["rest_06_24"], "pct"),
    ("invariant violations", lambda p: float(p["invariants"]["total"]), "int"),
]


def _lent(p: dict[str, Any]) -> int:
    """GPUs lent with a right of return (tagged or in kind) plus those carried in."""
    r = p["reclaim"]
    return int(r["lent_tagged"] + r.get("lent_in_kind", 0) + r.get("carried_in", 0))


def _count(p: dict[str, Any], key: str) -> float | None:
    """A right-of-return count, or None for a policy that lends nothing."""
    r = p["reclaim"]
    return float(r.get(key, 0)) if _lent(p) else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _fmt(values: Sequence[float], kind: str) -> str:
    if not values:
        return "–"
    mean, lo, hi = statistics.fmean(values), min(values), max(values)
    if kind == "pct":
        return f"{100 * mean:.1f} % ({100 * lo:.1f}–{100 * hi:.1f})"
    if kind == "int":
        return f"{mean:.1f} ({lo:.0f}–{hi:.0f})" if lo != hi else f"{lo:.0f}"
    return f"{mean:.2f} ({lo:.2f}–{hi:.2f})"


def table(reports: Sequence[dict[str, Any]]) -> str:
    """The Markdown table over ``reports`` (each a parsed report.json). Raises
    ``ValueError`` when the policies differ or a run failed."""
    names = list(reports[0]["policies"])
    for r in reports:
        if list(r["policies"]) != names:
            raise ValueError("the reports do not hold the same policies")
        for n, p in r["policies"].items():
            if "error" in p or p["invariants"]["total"]:
                raise ValueError(f"policy {n} of seed {r['scenario']['seed']} failed: not evidence")
    lines = [
        "| | " + " | ".join(LABELS.get(n, n) for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, metric, kind in ROWS:
        cells = []
        for n in names:
            values = [v for r in reports if (v := metric(r["policies"][n])) is not None]
            cells.append(_fmt(values, kind))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def inputs_note(reports: Sequence[dict[str, Any]]) -> str:
    """One line on the shared inputs: the failure model's measured shares of GPUs without
    an outage (mean over the runs) beside its calibration targets, and the LP arrivals'
    daily phase. Parts a report lacks are left out."""
    parts = []
    measured = [((r.get("inputs") or {}).get("failure_model") or {}).get("measured") or {} for r in reports]
    targets = (((reports[0].get("inputs") or {}).get("failure_model") or {}).get("calibration")) or {}
    for days in (14, 30):
        values = [m[f"no_outage_{days}d"] for m in measured if m.get(f"no_outage_{days}d") is not None]
        target = targets.get(f"target_no_outage_{days}d")
        if values:
            text = f"GPUs without an outage over {days} days: measured {100 * statistics.fmean(values):.1f} %"
            parts.append(text + (f" (target {100 * target:.0f} %)" if target is not None else ""))
    phase = (reports[0].get("inputs") or {}).get("lp_daily_phase") or {}
    if phase.get("method"):
        shift = phase.get("shift_hours")
        parts.append(f"LP arrivals: {phase['method']}" + (f", shift {shift} h" if shift else ""))
    return "; ".join(parts)


ACCOUNTING_HEAD: Final = (
    "| seed | cycles closed / all (complete) | lent tagged / in kind | carried in"
    " | back before the reclaim | back (same GPU) | replaced from standby | unrecoverable"
    " | still lent | lost | balance | violations (checks) |"
)


def accounting(reports: Sequence[dict[str, Any]], policy: str = "ror") -> str:
    """Right-of-return's per-cycle accounting, one Markdown row per report (its ``policy``
    section; reports without it are left out), summed over the run's closed cycles. ``balance``
    is ``lent + carried in + earlier loans - (every outcome + lost)`` summed over the closed
    cycles: 0 when each GPU was counted exactly once."""
    lines = [ACCOUNTING_HEAD, "|---" * ACCOUNTING_HEAD.count(" | ") + "|---|"]
    for report in reports:
        section = report["policies"].get(policy)
        if section is None:
            continue
        closed = [c for c in section.get("cycles", []) if c.get("closed")]
        total = {k: sum(int(c.get(k, 0)) for c in closed) for k in OUTCOMES}
        reasons: dict[str, int] = {}
        for c in closed:
            for reason, n in (c.get("unrecoverable_reasons") or {}).items():
                reasons[reason] = reasons.get(reason, 0) + int(n)
        balance = sum(
            int(c.get("lent", 0)) + int(c.get("carried_in", 0)) + int(c.get("earlier_loans", 0))
            for c in closed
        ) - sum(total.values())
        scaled = [c for c in section.get("cycles", []) if c.get("up_at") is not None]
        unrecoverable = str(total["unrecoverable"])
        if reasons:
            unrecoverable += " (" + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) + ")"
        cells = [
            str(report["scenario"]["seed"]),
            f"{len(closed)} / {len(scaled)} ({sum(1 for c in closed if c.get('complete'))})",
            " / ".join(str(sum(int(c.get(k, 0)) for c in closed)) for k in ("lent_tagged", "lent_in_kind")),
            str(sum(int(c.get("carried_in", 0)) for c in closed)),
            str(total["returned_before_reclaim"]),
            str(total["reclaimed_same"]),
            str(total["supplemented"]),
            unrecoverable,
            str(total["still_lent"]),
            str(total["lost"]),
            str(balance),
            f"{section['invariants']['total']} ({section['invariants']['checks']})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.sim_summary", description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument(
        "--accounting", action="store_true", help="add right-of-return's per-cycle accounting per run"
    )
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    try:
        print(table(reports))
    except ValueError as exc:
        print(f"sim_summary: {exc}", file=sys.stderr)
        return 1
    seeds = ", ".join(str(r["scenario"]["seed"]) for r in reports)
    print(f"\nmean (min–max) over seeds {seeds}")
    note = inputs_note(reports)
    if note:
        print(note)
    if args.accounting:
        print()
        print(accounting(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
