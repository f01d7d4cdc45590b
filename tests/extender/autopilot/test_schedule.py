"""The schedule source: windows across midnight and across both daylight-saving changes last
what the wall clock says; a plan step takes the most any instant in it needs."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from extender.autopilot.schedule import demand_at, demand_series, intervals
from flexlease.api.policy import ScheduleDemand

BERLIN = ZoneInfo("Europe/Berlin")
HOUR = 3600.0


def schedule(*windows: dict[str, object], zone: str = "Europe/Berlin") -> ScheduleDemand:
    return ScheduleDemand.model_validate({"timeZone": zone, "windows": list(windows)})


def at(text: str) -> float:
    """Epoch seconds of a Berlin wall time ``YYYY-MM-DDTHH:MM`` (first occurrence)."""
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN).timestamp()


NIGHT = schedule({"start": "22:00", "end": "06:00", "gpus": 4})


def test_a_window_across_midnight_ends_the_next_morning() -> None:
    assert demand_at(NIGHT, at("2026-06-01T21:59"), default=16) == 16
    assert demand_at(NIGHT, at("2026-06-01T22:00"), default=16) == 4
    assert demand_at(NIGHT, at("2026-06-02T00:30"), default=16) == 4
    assert demand_at(NIGHT, at("2026-06-02T05:59"), default=16) == 4
    assert demand_at(NIGHT, at("2026-06-02T06:00"), default=16) == 16


def test_the_spring_forward_night_is_an_hour_shorter() -> None:
    """Berlin, 2026-03-29 02:00 CET → 03:00 CEST: 22:00–06:00 lasts 7 real hours."""
    (night,) = [i for i in intervals(NIGHT, at("2026-03-28T12:00"), at("2026-03-29T12:00"))]
    assert night.end - night.start == 7 * HOUR
    assert datetime.fromtimestamp(night.end, BERLIN).hour == 6
    assert demand_at(NIGHT, at("2026-03-29T05:30"), default=16) == 4


def test_the_fall_back_night_is_an_hour_longer() -> None:
    """Berlin, 2026-10-25 03:00 CEST → 02:00 CET: 22:00–06:00 lasts 9 real hours."""
    (night,) = [i for i in intervals(NIGHT, at("2026-10-24T12:00"), at("2026-10-25T12:00"))]
    assert night.end - night.start == 9 * HOUR
    assert demand_at(NIGHT, night.end - 1, default=16) == 4
    assert demand_at(NIGHT, night.end, default=16) == 16


def test_a_start_in_the_spring_gap_is_shifted_forward_and_a_repeated_hour_starts_once() -> None:
    early = schedule({"start": "02:30", "end": "04:00", "gpus": 2})
    (spring,) = list(intervals(early, at("2026-03-29T00:00"), at("2026-03-29T05:00")))
    assert datetime.fromtimestamp(spring.start, BERLIN).strftime("%H:%M") == "03:30"  # 02:30 does not exist
    assert spring.end - spring.start == 0.5 * HOUR
    (autumn,) = list(intervals(early, at("2026-10-25T00:00"), at("2026-10-25T05:00")))
    assert autumn.end - autumn.start == 2.5 * HOUR  # from the first 02:30 (CEST) to 04:00 CET


def test_days_name_the_day_a_window_starts_on() -> None:
    weekend = schedule({"start": "20:00", "end": "02:00", "gpus": 6, "days": ["Sat"]})
    # 2026-06-06 is a Saturday: its window runs into Sunday; Friday's does not exist
    assert demand_at(weekend, at("2026-06-07T01:00"), default=10) == 6
    assert demand_at(weekend, at("2026-06-06T01:00"), default=10) == 10
    assert demand_at(weekend, at("2026-06-05T21:00"), default=10) == 10


def test_overlapping_windows_take_the_largest_count() -> None:
    both = schedule(
        {"start": "08:00", "end": "12:00", "gpus": 6}, {"start": "10:00", "end": "11:00", "gpus": 9}
    )
    assert demand_at(both, at("2026-06-01T10:30"), default=2) == 9
    assert demand_at(both, at("2026-06-01T11:30"), default=2) == 6


def test_a_step_needs_the_most_any_instant_in_it_needs() -> None:
    """A window starting or ending inside a step raises the whole step: the plan never runs below
    the schedule. Steps of 10 minutes from 21:40."""
    steps = demand_series(NIGHT, at("2026-06-01T21:40"), step_seconds=600, steps=4, default=16)
    assert steps == [16, 16, 4, 4]
    shifted = schedule({"start": "22:05", "end": "06:00", "gpus": 20})
    assert demand_series(shifted, at("2026-06-01T21:50"), step_seconds=600, steps=3, default=16) == [
        16,
        20,
        20,
    ]
    low = schedule({"start": "22:05", "end": "06:00", "gpus": 4})
    assert demand_series(low, at("2026-06-01T21:50"), step_seconds=600, steps=3, default=16) == [16, 16, 4]


def test_a_day_of_steps_across_a_dst_change_in_another_zone() -> None:
    """America/New_York springs forward on 2026-03-08: a 01:00–05:00 window is 3 real hours."""
    ny = ZoneInfo("America/New_York")
    window = schedule({"start": "01:00", "end": "05:00", "gpus": 1}, zone="America/New_York")
    start = datetime(2026, 3, 8, 0, 0, tzinfo=ny).timestamp()
    steps = demand_series(window, start, step_seconds=HOUR, steps=6, default=3)
    assert steps == [3, 1, 1, 1, 3, 3]  # 00, 01, 03, 04 (EDT), 05, 06
