"""Reading a policy's demand: per plan step, GPUs from its one source. Reads metrics through a
:class:`~extender.autopilot.prometheus.MetricsSource`; everything else is pure arithmetic from
:mod:`~extender.autopilot.schedule`, :mod:`~extender.autopilot.promql` and
:mod:`~extender.autopilot.forecast`.

* ``schedule``: the windows, step by step.
* ``prometheus``: the reading now, ``ceil(value / perGPU)`` for every step (a reading predicts
  nothing); a failed query or a jump hands over to the reactive fallback; blind → unknown.
* ``forecast``: the model's upper bound, ``ceil(upper / perGPU)`` per step, with the reading now
  as a floor for the current step (KALE's reactive correction: a surprise peak above the
  forecast is met at once). The model is trained again every ``forecast_retrain_seconds`` on
  ``historyDays`` of the query's history at ``forecast_step_seconds`` — the history lives in
  Prometheus, the one place that already keeps the job's metric over time, so the autopilot
  stores none of it; the last forecast is kept in the policy's ``status.forecast`` (so a
  restarted extender does not train again before its time) and, at each training, the MAPE of
  the previous forecast against the day that followed is computed from that history. While the
  history is too short for the model: ``fallbackSchedule``, else the last day's shape, else the
  reading now.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from extender.autopilot import forecast as model
from extender.autopilot import promql, schedule
from extender.autopilot.prometheus import MetricsSource
from flexlease.api.policy import (
    DemandStatus,
    ForecastDemand,
    ForecastStatus,
    GPULeasePolicySpec,
    GPULeasePolicyStatus,
    PrometheusDemand,
    ScheduleDemand,
)
from flexlease.errors import MetricsError

log = logging.getLogger(__name__)

FORECAST_HORIZON_SECONDS = 2 * model.DAY
"""A training forecasts two days: a day until the next training, and a day of plan beyond."""


@dataclass(frozen=True, slots=True)
class Note:
    """An Event to record about the policy: ``reason``, ``message``, whether a Warning."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class DemandOutcome:
    """``series``: GPUs per plan step (None: unknown, hold); ``demand`` and ``forecast`` for the
    status (the forecast's ``mape`` set by a training); ``notes`` to record as Events."""

    series: list[int] | None
    demand: DemandStatus
    forecast: ForecastStatus | None
    notes: list[Note] = field(default_factory=list)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def schedule_series(
    sched: ScheduleDemand, spec: GPULeasePolicySpec, *, start: float, steps: int
) -> list[int]:
    """The schedule's GPUs per step (default outside windows: ``defaultGPUs``, else ``maxGPUs``)."""
    default = sched.default_gpus if sched.default_gpus is not None else spec.max_gpus
    return schedule.demand_series(sched, start, step_seconds=spec.step_seconds, steps=steps, default=default)


async def _reading(source: MetricsSource | None, query: str) -> tuple[float | None, str]:
    if source is None:
        return None, "no Prometheus configured (autopilot.prometheus_url)"
    try:
        return await source.instant(query), ""
    except MetricsError as exc:
        return None, str(exc)


async def read_prometheus(
    spec: GPULeasePolicySpec,
    prom: PrometheusDemand,
    *,
    previous: DemandStatus | None,
    source: MetricsSource | None,
    allocated: int,
    now: float,
    steps: int,
) -> DemandOutcome:
    """The ``prometheus`` source (see the module docstring). ``previous``: the last status'
    demand (its ``value`` is the last reading, trusted or not)."""
    value, error = await _reading(source, prom.query)
    last = previous.value if previous is not None and previous.source in ("prometheus", "fallback") else None
    if value is not None and not promql.is_jump(value, last, ratio=prom.jump_ratio):
        gpus = promql.gpus_for(value, prom.per_gpu)
        demand = DemandStatus(
            gpus=gpus,
            value=value,
            source="prometheus",
            observed_at=_utc(now),
            message=f"ceil({value:g} / {prom.per_gpu:g})",
        )
        return DemandOutcome([gpus] * steps, demand, None)
    why = (
        error
        if value is None
        else f"reading {value:g} jumped from {last:g} (more than ×{prom.jump_ratio:g}); awaiting confirmation"
    )
    rule = prom.fallback
    if rule is None:
        signal: float | None = None
    elif rule.query is None or rule.query == prom.query:
        signal = value
    else:
        signal, _ = await _reading(source, rule.query)
    answer = promql.reactive(signal, rule, allocated=allocated)
    demand = DemandStatus(
        gpus=answer.gpus,
        value=value,
        source="fallback" if answer.gpus is not None else "unknown",
        observed_at=_utc(now),
        message=f"{why}; {answer.message}",
    )
    note = Note(
        "DemandFallback" if answer.gpus is not None else "DemandUnknown", demand.message, warning=True
    )
    return DemandOutcome(None if answer.gpus is None else [answer.gpus] * steps, demand, None, [note])


def _stored(status: ForecastStatus | None) -> model.Forecast | None:
    if status is None or not status.values:
        return None
    return model.Forecast(
        start=status.start.timestamp(),
        step_seconds=float(status.step_seconds),
        values=tuple(status.values),
        upper=tuple(status.upper),
        model=status.model,
        history_points=status.history_points,
    )


def _forecast_status(fc: model.Forecast, *, now: float, mape: tuple[float | None, int]) -> ForecastStatus:
    return ForecastStatus(
        trained_at=_utc(now),
        start=_utc(fc.start),
        step_seconds=round(fc.step_seconds),
        model=fc.model,
        history_points=fc.history_points,
        values=[round(v, 3) for v in fc.values],
        upper=[round(v, 3) for v in fc.upper],
        mape=None if mape[0] is None else round(mape[0], 4),
        mape_points=mape[1],
    )


async def read_forecast(
    spec: GPULeasePolicySpec,
    fc_spec: ForecastDemand,
    *,
    status: GPULeasePolicyStatus,
    source: MetricsSource | None,
    now: float,
    start: float,
    steps: int,
    retrain_seconds: float,
    forecast_step_seconds: float,
) -> DemandOutcome:
    """The ``forecast`` source (see the module docstring): trains when the stored forecast is
    older than ``retrain_seconds`` or missing (the fit runs in a worker thread)."""
    notes: list[Note] = []
    stored = status.forecast
    fc = _stored(stored)
    step = max(float(spec.step_seconds), forecast_step_seconds)
    due = (
        stored is None
        or now - stored.trained_at.timestamp() >= retrain_seconds
        or fc is None
        or fc.end <= now
    )
    if due and source is not None:
        try:
            history = await source.series(fc_spec.query, seconds=fc_spec.history_days * model.DAY, step=step)
        except MetricsError as exc:
            history = None
            notes.append(Note("ForecastNotTrained", f"history unreadable: {exc}", warning=True))
        if history is not None:
            previous_error = (
                (None, 0)
                if fc is None
                else model.mape(fc, history, since=max(fc.start, now - model.DAY), until=now)
            )
            trained = await asyncio.to_thread(
                model.train,
                history,
                step_seconds=step,
                horizon_seconds=FORECAST_HORIZON_SECONDS,
                confidence=fc_spec.confidence,
            )
            if trained is None:
                trained = model.last_day(history, step_seconds=step, horizon_seconds=FORECAST_HORIZON_SECONDS)
            if trained is not None:
                fc = trained
                stored = _forecast_status(trained, now=now, mape=previous_error)
                error = (
                    "n/a"
                    if previous_error[0] is None
                    else f"{previous_error[0]:.1%} over {previous_error[1]} points"
                )
                notes.append(
                    Note(
                        "ForecastTrained",
                        f"{trained.model} on {trained.history_points} points; "
                        f"MAPE of the last day's forecast: {error}",
                    )
                )
            else:
                fc, stored = None, None
    value, error = await _reading(source, fc_spec.query)
    floor = promql.gpus_for(value, fc_spec.per_gpu) if value is not None else None
    if fc is not None and fc.end > now:
        series: list[int] = []
        for i in range(steps):
            upper = fc.upper_at(start + i * spec.step_seconds)
            series.append(promql.gpus_for(upper if upper is not None else fc.upper[-1], fc_spec.per_gpu))
        source_name = "forecast" if not fc.model.startswith("last day") else "lastDay"
        message = f"{fc.model}, upper bound at {fc_spec.confidence:g}"
        if floor is not None and floor > series[0]:
            series[0] = floor
            message += f"; reading now {value:g} above it: step raised to {floor}"
        demand = DemandStatus(
            gpus=series[0], value=value, source=source_name, observed_at=_utc(now), message=message
        )
        return DemandOutcome(series, demand, stored, notes)
    if fc_spec.fallback_schedule is not None:
        series = schedule_series(fc_spec.fallback_schedule, spec, start=start, steps=steps)
        if floor is not None:
            series[0] = max(series[0], floor)
        demand = DemandStatus(
            gpus=series[0],
            value=value,
            source="schedule",
            observed_at=_utc(now),
            message="history too short: fallbackSchedule",
        )
        return DemandOutcome(series, demand, stored, notes)
    if floor is not None:
        demand = DemandStatus(
            gpus=floor,
            value=value,
            source="prometheus",
            observed_at=_utc(now),
            message="history too short: the reading now",
        )
        return DemandOutcome([floor] * steps, demand, stored, notes)
    demand = DemandStatus(
        gpus=None,
        value=None,
        source="unknown",
        observed_at=_utc(now),
        message=f"no forecast and no reading: {error}",
    )
    notes.append(Note("DemandUnknown", demand.message, warning=True))
    return DemandOutcome(None, demand, stored, notes)


async def read(
    spec: GPULeasePolicySpec,
    *,
    status: GPULeasePolicyStatus,
    source: MetricsSource | None,
    allocated: int,
    now: float,
    start: float,
    steps: int,
    retrain_seconds: float,
    forecast_step_seconds: float,
) -> DemandOutcome:
    """The policy's demand from its one source, ``steps`` plan steps from ``start``."""
    demand = spec.demand
    if demand.schedule is not None:
        series = schedule_series(demand.schedule, spec, start=start, steps=steps)
        message = f"{len(demand.schedule.windows)} windows in {demand.schedule.time_zone}"
        return DemandOutcome(
            series,
            DemandStatus(gpus=series[0], source="schedule", observed_at=_utc(now), message=message),
            None,
        )
    if demand.prometheus is not None:
        return await read_prometheus(
            spec,
            demand.prometheus,
            previous=status.demand,
            source=source,
            allocated=allocated,
            now=now,
            steps=steps,
        )
    assert demand.forecast is not None  # Demand guarantees exactly one source
    return await read_forecast(
        spec,
        demand.forecast,
        status=status,
        source=source,
        now=now,
        start=start,
        steps=steps,
        retrain_seconds=retrain_seconds,
        forecast_step_seconds=forecast_step_seconds,
    )
