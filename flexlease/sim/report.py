"""The simulator's outputs: ``report.json``, two PNG plots (matplotlib, Agg) and a text table.

* ``ha_share.png`` (Fig. 14): the online job's HA share at full size over simulated days for
  each policy, with the share of its initial GPUs held fixed (no elastic scaling) and the
  cluster's HA share for reference;
* ``lp_fulfilment.png`` (Fig. 10): LP request fulfilment by hour of day for each policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from flexlease.sim.metrics import OUTCOMES
from flexlease.sim.traces import DAY

COLORS = {"ror": "tab:green", "plain": "tab:red", "static": "tab:blue"}
LABELS = {"ror": "right-of-return", "plain": "plain leasing", "static": "no scaling"}


def write_json(report: dict[str, Any], out: Path, name: str = "report.json") -> Path:
    """Write ``report`` as ``out/name`` (keys sorted, so equal reports are equal files);
    returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    return path


def _daily(samples: list[dict[str, Any]], key: str, *, full_only: bool) -> tuple[list[float], list[float]]:
    """Per-day means of ``key`` over samples (optionally only those at full size)."""
    days: dict[int, list[float]] = {}
    for s in samples:
        value = s.get(key)
        if value is None or (full_only and not s.get("full")):
            continue
        days.setdefault(int(s["t"] // DAY), []).append(float(value))
    xs = sorted(days)
    return [x + 0.5 for x in xs], [sum(days[x]) / len(days[x]) for x in xs]


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    """Write the two PNGs; returns their paths. Policies that failed are left out.

    ``ha_share.png``: per policy the daily mean, at full size, of the share of the online
    job's GPUs in the HA tier, and the cluster's share for reference (the job's initial GPUs
    too when no ``static`` run is there), reference lines cut at the last day with policy
    data. ``lp_fulfilment.png``: per hour of day, the GPUs LP jobs requested (outline, mean
    per day) and the GPUs granted within the patience per policy (bars); hours without
    requests stay empty."""
    policies = {k: v for k, v in report["policies"].items() if v.get("samples")}
    paths: list[Path] = []

    fig = Figure(figsize=(8, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    reference: list[dict[str, Any]] = []
    last_x = 0.0
    for name, section in policies.items():
        xs, ys = _daily(section["samples"], "job_ha_share", full_only=True)
        ax.plot(
            xs, [100 * y for y in ys], color=COLORS.get(name), label=f"online job, {LABELS.get(name, name)}"
        )
        last_x = max([last_x, *xs])
        reference = section["samples"]
    if reference:
        if "static" not in policies:
            xs, ys = _daily(reference, "static_ha_share", full_only=False)
            kept = [(x, y) for x, y in zip(xs, ys, strict=True) if x <= last_x]
            ax.plot(
                [x for x, _ in kept],
                [100 * y for _, y in kept],
                color="tab:blue",
                linestyle=":",
                label="online job's initial GPUs",
            )
        xs, ys = _daily(reference, "cluster_ha_share", full_only=False)
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if x <= last_x]
        ax.plot(
            [x for x, _ in kept],
            [100 * y for _, y in kept],
            color="grey",
            linestyle="--",
            label="whole cluster (general pool)",
        )
    ax.set_xlabel("simulated day")
    ax.set_ylabel("GPUs in the HA tier (% of the group's GPUs)")
    ax.set_title("HA share over time (cf. WeFlex Fig. 14); daily means, job at peak size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = out / "ha_share.png"
    fig.savefig(path, dpi=110)
    paths.append(path)

    fig = Figure(figsize=(8, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    n = max(1, len(policies))
    width = 0.8 / n
    asked_drawn = False
    for k, (name, section) in enumerate(policies.items()):
        lp = section["lp_fulfilment"]
        days = float(lp.get("days") or 1.0)
        asked = lp.get("requested_gpus_by_hour") or [0] * 24
        granted = lp.get("granted_gpus_by_hour") or [0] * 24
        hours = [h for h in range(24) if asked[h]]
        if not asked_drawn:
            ax.bar(
                hours,
                [asked[h] / days for h in hours],
                width=0.9,
                fill=False,
                edgecolor="black",
                linewidth=0.8,
                label="GPUs requested",
            )
            asked_drawn = True
        offset = (k - (n - 1) / 2) * width
        ax.bar(
            [h + offset for h in hours],
            [granted[h] / days for h in hours],
            width=width,
            color=COLORS.get(name),
            label=f"granted within patience, {LABELS.get(name, name)}",
        )
    ax.set_xlabel("hour of day of the request")
    ax.set_ylabel("LP GPUs per hour of day (mean per day)")
    ax.set_title("LP requests and grants by hour (cf. WeFlex Fig. 10)")
    ax.set_xticks(range(0, 24, 2))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "lp_fulfilment.png"
    fig.savefig(path, dpi=110)
    paths.append(path)
    return paths


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f} %"


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(report: dict[str, Any]) -> str:
    """A short Markdown table of the headline figures per policy."""
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("HA share of the job at start", lambda p: _pct(p["ha_share"]["start"])),
        ("HA share, first 7 days (mean at peak)", lambda p: _pct(p["ha_share"]["first_days_mean"])),
        ("HA share, last 7 days (mean at peak)", lambda p: _pct(p["ha_share"]["last_days_mean"])),
        ("cluster HA share, last 7 days", lambda p: _pct(p["ha_share"]["cluster_last_days_mean"])),
        ("initial GPUs kept, last 7 days", lambda p: _pct(p["ha_share"].get("static_last_days_mean"))),
        (
            "scale-up cycles (complete / closed / all)",
            lambda p: " / ".join(
                str(p["reclaim"][k]) for k in ("complete_cycles", "closed_cycles", "cycles")
            ),
        ),
        (
            "lent GPUs tagged / in kind (standby) / untagged (LA); carried in",
            lambda p: (
                f"{p['reclaim']['lent_tagged']} / {p['reclaim']['lent_in_kind']}"
                f" / {p['reclaim']['lent_untagged']}; {p['reclaim']['carried_in']}"
            ),
        ),
        (
            "lent GPUs back before the reclaim / same GPU / supplemented / unrecoverable / still lent"
            " / left on loan / lost",
            lambda p: " / ".join(str(p["reclaim"].get(k, 0)) for k in OUTCOMES),
        ),
        (
            "released GPUs the job got back",
            lambda p: f"{p['reclaim']['same_devices_back']} / {p['reclaim']['released_gpus']}",
        ),
        (
            "reclaim time mean / max (sim s)",
            lambda p: f"{_num(p['reclaim']['reclaim_s_mean'])} / {_num(p['reclaim']['reclaim_s_max'])}",
        ),
        (
            "restore delay mean / max (sim min)",
            lambda p: (
                f"{_num(_div(p['reclaim']['restore_delay_s_mean'], 60), '{:.0f}')}"
                f" / {_num(_div(p['reclaim']['restore_delay_s_max'], 60), '{:.0f}')}"
            ),
        ),
        ("standby GPUs held by the job (max)", lambda p: str(p["standby"]["max_job_standby_gpus"])),
        (
            "job restarts / interruption (h)",
            lambda p: f"{p['job']['restarts']} / {_num(p['job']['interruption_hours'], '{:.1f}')}",
        ),
        ("LP fulfilment overall", lambda p: _pct(p["lp_fulfilment"]["overall"])),
        (
            "LP fulfilment 00–06 / 06–24",
            lambda p: (
                f"{_pct(p['lp_fulfilment']['trough_00_06'])} / {_pct(p['lp_fulfilment']['rest_06_24'])}"
            ),
        ),
        (
            "LP jobs completed / withdrawn / resubmitted",
            lambda p: (
                f"{p['scheduling']['lp_jobs_completed']} / {p['scheduling']['lp_jobs_withdrawn']}"
                f" / {p['scheduling']['lp_resubmissions']}"
            ),
        ),
        (
            "LP pods evicted (controller / preemption)",
            lambda p: (
                f"{p['scheduling']['lp_pods_evicted_by_controller']} / {p['scheduling']['preempted_lp_pods']}"
            ),
        ),
        (
            "scheduling cycles / HTTP errors",
            lambda p: f"{p['scheduling']['cycles']} / {p['scheduling']['http_errors']}",
        ),
        (
            "invariant violations (checks)",
            lambda p: f"{p['invariants']['total']} ({p['invariants']['checks']})",
        ),
    ]
    names = list(report["policies"])
    lines = ["| | " + " | ".join(LABELS.get(n, n) for n in names) + " |", "|---|" + "---|" * len(names)]
    for label, fn in rows:
        cells = []
        for n in names:
            section = report["policies"][n]
            if "error" in section and "ha_share" not in section:
                cells.append("error")
                continue
            try:
                cells.append(fn(section))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    errors = [f"{n}: {report['policies'][n]['error']}" for n in names if "error" in report["policies"][n]]
    if errors:
        lines.append("")
        lines.extend(f"ERROR {e}" for e in errors)
    return "\n".join(lines)


def _div(value: Any, by: float) -> float | None:
    return None if value is None else float(value) / by
