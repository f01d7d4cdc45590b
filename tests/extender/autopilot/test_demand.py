"""Reading a policy's demand through the MetricsSource seam (here a synthetic trace, as the
simulator will plug in): jumps wait for confirmation, the forecast trains daily, keeps its
forecast in the status (no retraining after a restart), reports the MAPE of the previous day,
and falls back while the history is short."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from extender.autopilot import demand
from extender.autopilot.forecast import DAY
from flexlease.api.policy import DemandStatus, GPULeasePolicySpec, GPULeasePolicyStatus
from flexlease.errors import MetricsError

HOUR = 3600.0
T0 = 1_780_000_000.0


@dataclass
class Trace:
    """A MetricsSource on a function of time, ``now`` moved by the test."""

    now: float = T0
    values: dict[str, float] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    series_calls: int = 0

    def demand_at(self, t: float) -> float:
        hours = (t % DAY) / HOUR
        weekend = ((t // DAY) % 7) >= 5
        return 1000 + 400 * np.sin(2 * np.pi * (hours - 9) / 24) + 250 * weekend

    async def instant(self, query: str) -> float:
        if query in self.failing:
            raise MetricsError(f"query {query!r} returned no series")
        return self.values.get(query, self.demand_at(self.now))

    async def series(self, query: str, *, seconds: float, step: float) -> list[tuple[float, float]]:
        self.series_calls += 1
        if query in self.failing:
            raise MetricsError("unreachable")
        rng = np.random.default_rng(int(self.now))
        times = np.arange(self.now - seconds, self.now + 1, step)
        return [(float(t), float(self.demand_at(t) + rng.normal(0, 20))) for t in times]


def spec(demand_spec: dict[str, object]) -> GPULeasePolicySpec:
    return GPULeasePolicySpec.model_validate(
        {"owner": "online/rec", "minGPUs": 1, "maxGPUs": 20, "stepSeconds": 600, "demand": demand_spec}
    )


async def read(
    s: GPULeasePolicySpec, trace: Trace, status: GPULeasePolicyStatus, *, allocated: int = 8
) -> demand.DemandOutcome:
    return await demand.read(
        s,
        status=status,
        source=trace,
        allocated=allocated,
        now=trace.now,
        start=trace.now,
        steps=12,
        retrain_seconds=DAY,
        forecast_step_seconds=HOUR,
    )


PROM = spec(
    {
        "prometheus": {
            "query": "rate",
            "perGPU": 100,
            "jumpRatio": 3,
            "fallback": {"query": "lag", "scaleUpAbove": 50, "scaleDownBelow": 5, "stepGPUs": 2},
        }
    }
)


async def test_a_jump_waits_for_a_second_reading_and_the_fallback_decides_meanwhile() -> None:
    trace = Trace(values={"rate": 500, "lag": 80})
    first = await read(PROM, trace, GPULeasePolicyStatus())
    assert (first.demand.source, first.demand.gpus, first.series) == ("prometheus", 5, [5] * 12)
    trace.values["rate"] = 2000  # ×4: a jump
    jumped = await read(PROM, trace, GPULeasePolicyStatus(demand=first.demand))
    assert (jumped.demand.source, jumped.demand.gpus) == ("fallback", 10)  # lag 80 > 50: 8 + 2
    assert "jumped from 500" in jumped.demand.message
    assert [n.reason for n in jumped.notes] == ["DemandFallback"]
    confirmed = await read(PROM, trace, GPULeasePolicyStatus(demand=jumped.demand))
    assert (confirmed.demand.source, confirmed.demand.gpus) == ("prometheus", 20)


async def test_blind_means_unknown_and_hold() -> None:
    trace = Trace(failing={"rate", "lag"})
    blind = await read(PROM, trace, GPULeasePolicyStatus())
    assert blind.series is None and blind.demand.source == "unknown"
    assert "fallback signal unreadable too" in blind.demand.message
    no_source = await demand.read(
        PROM, status=GPULeasePolicyStatus(), source=None, allocated=8, now=T0, start=T0, steps=2,
        retrain_seconds=DAY, forecast_step_seconds=HOUR,
    )  # fmt: skip
    assert no_source.series is None and "no Prometheus configured" in no_source.demand.message


FORECAST = spec({"forecast": {"query": "rate", "perGPU": 100, "historyDays": 21}})


async def test_forecast_trains_daily_keeps_its_forecast_and_reports_the_last_day_s_mape() -> None:
    trace = Trace()
    first = await read(FORECAST, trace, GPULeasePolicyStatus(demand=None))
    assert trace.series_calls == 1
    assert first.forecast is not None and first.forecast.model.startswith("MSTL(daily+weekly)")
    assert first.forecast.mape is None  # nothing to compare yet
    assert first.demand.source == "forecast" and first.series is not None
    # the plan takes the upper bound: never below the point forecast
    expected = [int(np.ceil(u / 100 - 1e-9)) for u in first.forecast.upper]
    assert first.series[0] >= expected[0] - 1
    status = GPULeasePolicyStatus(demand=first.demand, forecast=first.forecast)

    trace.now += 6 * HOUR  # a restart reads the status: no training before a day has passed
    again = await read(FORECAST, trace, status)
    assert trace.series_calls == 1 and again.forecast == first.forecast

    trace.now = T0 + DAY
    next_day = await read(FORECAST, trace, status)
    assert trace.series_calls == 2
    assert next_day.forecast is not None and next_day.forecast.trained_at.timestamp() == trace.now
    assert next_day.forecast.mape is not None and next_day.forecast.mape < 0.06
    assert next_day.forecast.mape_points == 23  # the first point forecast is an hour past the training
    assert any(n.reason == "ForecastTrained" and "MAPE" in n.message for n in next_day.notes)


async def test_a_surprise_peak_above_the_forecast_raises_the_current_step() -> None:
    trace = Trace()
    first = await read(FORECAST, trace, GPULeasePolicyStatus())
    assert first.series is not None
    trace.values["rate"] = 5000  # far above any forecast
    peak = await read(FORECAST, trace, GPULeasePolicyStatus(forecast=first.forecast))
    assert peak.series is not None and peak.series[0] == 50 and peak.series[1] == first.series[1]
    assert "above it" in peak.demand.message


@pytest.mark.parametrize(
    ("days", "fallback", "source"),
    [
        (2, None, "lastDay"),
        (0.5, {"windows": [{"start": "00:00", "end": "23:59", "gpus": 6}]}, "schedule"),
        (0.5, None, "prometheus"),
    ],
)
async def test_short_histories_fall_back(days: float, fallback: object, source: str) -> None:
    body: dict[str, object] = {"query": "rate", "perGPU": 100, "historyDays": 2}
    if fallback is not None:
        body["fallbackSchedule"] = fallback
    s = spec({"forecast": body})

    class Short(Trace):
        async def series(self, query: str, *, seconds: float, step: float) -> list[tuple[float, float]]:
            return await super().series(query, seconds=days * DAY, step=step)

    outcome = await read(s, Short(), GPULeasePolicyStatus())
    assert outcome.demand.source == source and outcome.series is not None


async def test_forecast_without_history_or_reading_is_unknown() -> None:
    trace = Trace(failing={"rate"})
    outcome = await read(
        FORECAST,
        trace,
        GPULeasePolicyStatus(demand=DemandStatus(source="x", observed_at="2026-01-01T00:00:00Z")),
    )
    assert outcome.series is None and outcome.demand.source == "unknown"
    assert [n.reason for n in outcome.notes] == ["ForecastNotTrained", "DemandUnknown"]
