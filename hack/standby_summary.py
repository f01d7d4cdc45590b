"""Compare the fixed and the adaptive standby pool over simulator reports (``report.json`` of
``python -m flexlease.sim --policy ror``), one Markdown row per configuration: mean and spread
(min–max) over the runs (seeds) given for it.

    python -m hack.standby_summary "fixed=out/a/fixed-1/report.json,out/a/fixed-2/report.json" \\
        "adaptive=out/a/adaptive-1/report.json,..."

Columns: Reclaims (scale-ups with a Reclaim), the share fully served (every lent GPU back as
itself or replaced from the standby pool: none unrecoverable, still lent or lost), lent GPUs
replaced from standby, lent GPUs unrecoverable, idle standby GPU-hours (standby GPUs healthy,
held by no pod and untagged, counted hourly after the warm-up), LP fulfilment, the job's
interruption hours, and the invariant checks with their violations. A run with an error is
refused (exit status 1); violations are shown, never hidden.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

Metric = Callable[[dict[str, Any]], float | None]


def _share(p: dict[str, Any]) -> float | None:
    cycles = int(p["reclaim"]["cycles"])
    return p["reclaim"]["complete_cycles"] / cycles if cycles else None


COLUMNS: Final[list[tuple[str, Metric, str]]] = [
    ("Reclaims", lambda p: p["reclaim"]["cycles"], "int"),
    ("fully served", _share, "pct"),
    ("supplemented GPUs", lambda p: p["reclaim"]["supplemented"], "int"),
    ("unrecoverable GPUs", lambda p: p["reclaim"]["unrecoverable"], "int"),
    ("idle standby GPU-h", lambda p: p["standby"]["idle_gpu_hours"], "int"),
    ("LP fulfilment", lambda p: p["lp_fulfilment"]["overall"], "pct"),
    ("job interruption h", lambda p: p["job"]["interruption_hours"], "float"),
]


def _fmt(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{100 * value:.1f} %"
    if kind == "float":
        return f"{value:.2f}"
    return f"{value:.1f}" if value != int(value) else f"{int(value)}"


def cell(values: Sequence[float | None], kind: str) -> str:
    """Mean and (min–max) of the known ``values``; ``–`` when none is known."""
    known = [v for v in values if v is not None]
    if not known:
        return "–"
    mean = _fmt(statistics.fmean(known), kind)
    if len(known) == 1 or min(known) == max(known):
        return mean
    return f"{mean} ({_fmt(min(known), kind)}–{_fmt(max(known), kind)})"


def policy_of(report: dict[str, Any]) -> dict[str, Any]:
    """The ``ror`` section of a report. Raises ``ValueError`` when it is missing or the run
    ended with an error."""
    section = report.get("policies", {}).get("ror")
    if section is None:
        raise ValueError("no ror policy in the report (run with --policy ror)")
    if section.get("error"):
        raise ValueError(f"the run failed: {section['error']}")
    return dict(section)


Groups = Sequence[tuple[str, list[dict[str, Any]]]]
"""(label, the reports of its seeds) per row."""


def rows(
    groups: Groups,
    columns: Sequence[tuple[str, Metric, str]],
    *,
    first: str,
    section: Callable[[dict[str, Any]], dict[str, Any]] = policy_of,
) -> str:
    """A Markdown table, one row per group: ``first`` heads the label column, then the number
    of runs, each column's :func:`cell` over ``section(report)`` of the group's reports, and the
    invariant violations / checks summed over them. Raises ``ValueError`` or ``KeyError`` for a
    report without what a column reads."""
    head = [first, "runs", *(name for name, _, _ in columns), "invariant violations / checks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, reports in groups:
        sections = [section(r) for r in reports]
        cells = [cell([metric(s) for s in sections], kind) for _, metric, kind in columns]
        violations = sum(int(s["invariants"]["total"]) for s in sections)
        checks = sum(int(s["invariants"]["checks"]) for s in sections)
        row = [label, str(len(sections)), *cells, f"{violations} / {checks}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def table(groups: Groups) -> str:
    """The Markdown table: one row per (label, reports of its seeds)."""
    return rows(groups, COLUMNS, first="standby pool")


def run(argv: Sequence[str] | None, *, prog: str, doc: str, render: Callable[[Groups], str]) -> int:
    """The command line of a summary script: ``LABEL=REPORT[,REPORT...]`` arguments, the
    table ``render`` makes of them printed; exit status 1 (with ``prog``'s message on stderr)
    when a report cannot be read or ``render`` refuses it, 2 (argparse) for bad arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("group", nargs="+", help="LABEL=REPORT[,REPORT...]")
    args = parser.parse_args(argv)
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for spec in args.group:
        label, sep, paths = spec.partition("=")
        if not sep or not paths:
            parser.error(f"expected LABEL=REPORT[,REPORT...], got {spec!r}")
        try:
            groups.append((label, [json.loads(Path(p).read_text()) for p in paths.split(",")]))
        except OSError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
    try:
        print(render(groups))
    except (ValueError, KeyError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv, prog="standby_summary", doc=__doc__ or "", render=table)


if __name__ == "__main__":
    sys.exit(main())
