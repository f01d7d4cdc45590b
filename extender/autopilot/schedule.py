"""The ``schedule`` demand source: GPUs by time windows of a time zone. Pure; no I/O.

A window (``start``/``end`` as local ``HH:MM``, optional ``days`` it starts on) is placed on the
calendar of its IANA time zone (:mod:`zoneinfo`), then compared in UTC, so windows across
midnight and across daylight-saving changes last what the wall clock says:

* ``end`` before ``start``: the window ends on the next day (``22:00``–``06:00``);
* a local time that does not exist (the spring-forward gap, Europe/Berlin 02:30 on the last
  Sunday of March) is shifted forward by the gap (03:30), as cron and systemd do;
* a local time that occurs twice (the fall-back hour) means its first occurrence (PEP 495
  ``fold=0``), so such a night's window is an hour longer in real time.

Demand at an instant is the largest ``gpus`` of the windows active then, else the default.
A plan step covers an interval: its demand is the most any instant in it needs (a window
that starts inside the step raises the whole step), so the plan never runs below the
schedule.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from flexlease.api.policy import ScheduleDemand, ScheduleWindow


@dataclass(frozen=True, slots=True)
class Interval:
    """One occurrence of a window: ``[start, end)`` as epoch seconds, and its GPUs."""

    start: float
    end: float
    gpus: int


def _clock(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def _local(day: date, at: time, zone: zoneinfo.ZoneInfo) -> float:
    """Epoch seconds of the wall time ``at`` on ``day`` in ``zone`` (gap: shifted forward;
    repeated hour: first occurrence)."""
    # fold=0: in a gap the offset before the change applies, which lands the gap's length
    # later on the wall clock; in a repeated hour, its first occurrence
    return datetime.combine(day, at, tzinfo=zone).astimezone(UTC).timestamp()


def _starts_on(window: ScheduleWindow, day: date) -> bool:
    return window.days is None or any(d.number == day.weekday() for d in window.days)


def intervals(schedule: ScheduleDemand, start: float, end: float) -> Iterator[Interval]:
    """Every window occurrence that overlaps ``[start, end)`` (epoch seconds), in no order."""
    zone = zoneinfo.ZoneInfo(schedule.time_zone)
    first = datetime.fromtimestamp(start, zone).date() - timedelta(days=1)
    last = datetime.fromtimestamp(end, zone).date()
    day = first
    while day <= last:
        for window in schedule.windows:
            if not _starts_on(window, day):
                continue
            opens, closes = _clock(window.start), _clock(window.end)
            begin = _local(day, opens, zone)
            finish = _local(day + timedelta(days=1) if closes <= opens else day, closes, zone)
            if begin < end and finish > start and finish > begin:
                yield Interval(begin, finish, window.gpus)
        day += timedelta(days=1)


def demand_at(schedule: ScheduleDemand, when: float, *, default: int) -> int:
    """GPUs the schedule asks for at ``when`` (epoch seconds): the largest count of the windows
    active then, else ``default`` (the schedule's ``defaultGPUs`` or the policy's ``maxGPUs``,
    the caller's choice)."""
    active = [i.gpus for i in intervals(schedule, when, when + 1e-6) if i.start <= when < i.end]
    return max(active) if active else default


def demand_series(
    schedule: ScheduleDemand, start: float, *, step_seconds: float, steps: int, default: int
) -> list[int]:
    """The demand of ``steps`` consecutive steps from ``start`` (epoch seconds), each the most
    any instant of ``[start + i·step, start + (i+1)·step)`` needs. Raises ``ValueError`` for
    ``step_seconds`` <= 0 or negative ``steps``."""
    if step_seconds <= 0 or steps < 0:
        raise ValueError(f"need step_seconds > 0 and steps >= 0, got {step_seconds}, {steps}")
    end = start + step_seconds * steps
    occurrences = sorted(intervals(schedule, start, end), key=lambda i: i.start)
    out: list[int] = []
    for i in range(steps):
        lo, hi = start + i * step_seconds, start + (i + 1) * step_seconds
        overlapping = [o for o in occurrences if o.start < hi and o.end > lo]
        covered_to = lo
        for o in overlapping:  # sorted by start: a gap before one means default time
            if o.start > covered_to:
                break
            covered_to = max(covered_to, o.end)
        value = max((o.gpus for o in overlapping), default=default)
        out.append(value if covered_to >= hi else max(value, default))
    return out
