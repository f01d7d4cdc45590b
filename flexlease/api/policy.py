"""The ``GPULeasePolicy`` custom resource (``flexlease.io/v1alpha1``, namespaced): the lease
autopilot's input and report (DESIGN §2, issue #40).

One policy per online job (``spec.owner``, ``<ns>/<job>``): how many GPUs the job may run on
(``minGPUs`` … ``maxGPUs``, the peak allocation), where its demand comes from (exactly one of
``demand.schedule``, ``demand.prometheus``, ``demand.forecast``), KALE's plan stabilization
(``rho``, ``tauSeconds``; Kuaishou, SoCC '24), the lead time of a Reclaim (``auto``: the
prelaunch window W of WeFlex formulas 1–3 plus the reclaim grace period, or seconds) and
``dryRun``. Its ``status`` is written only by the autopilot (:mod:`extender.autopilot`):
the demand it read, the plan, the forecast and its error, the last decision, conditions.

The models are the one source of truth: ``hack/gen_crds.py`` writes
``manifests/base/crds/gpuleasepolicies.yaml`` from them (:func:`flexlease.api.crd.gpuleasepolicy_crd`,
which adds the CEL rules the API server checks, so an invalid policy is refused at admission
with a message naming the field). The pydantic validators repeat those rules, and add what CEL
cannot check (an IANA time zone that exists), for stores without an API server. Pure; no I/O.
"""

from __future__ import annotations

import enum
import math
import zoneinfo
from datetime import datetime
from typing import Any, Final, Literal, Self

from pydantic import Field, field_validator, model_validator

from flexlease.api import keys
from flexlease.api.base import KubeModel
from flexlease.api.resources import (
    DEFAULT_GRACE_SECONDS,
    MAX_GRACE_SECONDS,
    MIN_GRACE_SECONDS,
    Condition,
    ObjectMeta,
)

OWNER_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
"""``<namespace>/<job>``, as ``GPULease.spec.owner``."""
CLOCK_PATTERN: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
"""A local wall-clock time of day, ``HH:MM`` (24-hour)."""
MAX_LEAD_SECONDS: Final = 86_400
MAX_WINDOWS: Final = 64
MAX_QUERY_LENGTH: Final = 4096


class Weekday(enum.StrEnum):
    """A day of the week, as cron's and systemd's three-letter names."""

    MON = "Mon"
    TUE = "Tue"
    WED = "Wed"
    THU = "Thu"
    FRI = "Fri"
    SAT = "Sat"
    SUN = "Sun"

    @property
    def number(self) -> int:
        """``datetime.weekday()`` of this day (Monday = 0)."""
        return list(Weekday).index(self)


class ScheduleWindow(KubeModel):
    """GPUs the job needs from ``start`` to ``end`` (local wall time of the schedule's time
    zone). ``end`` before ``start`` ends the next day (a window across midnight). ``days``: the
    days a window *starts* on (all days when unset)."""

    start: str = Field(pattern=CLOCK_PATTERN, max_length=5, description="Local start time, HH:MM (24-hour).")
    end: str = Field(
        pattern=CLOCK_PATTERN,
        max_length=5,
        description="Local end time, HH:MM; before start means the next day. Must differ from start.",
    )
    gpus: int = Field(ge=0, le=100_000, description="GPUs the job needs during the window.")
    days: list[Weekday] | None = Field(
        default=None,
        max_length=7,
        description="Days of the week the window starts on (Mon … Sun); unset: every day.",
    )

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if self.start == self.end:
            raise ValueError("a window's start and end must differ")
        return self


class ScheduleDemand(KubeModel):
    """Demand as time windows of a time zone (cron-like; DST and midnight handled by
    :mod:`extender.autopilot.schedule`). Outside every window: ``defaultGPUs`` (unset: the
    policy's ``maxGPUs``); where windows overlap, the largest count."""

    time_zone: str = Field(
        default="UTC", min_length=1, max_length=64, description="IANA time zone, e.g. Europe/Berlin."
    )
    default_gpus: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        alias="defaultGPUs",
        description="GPUs outside every window (unset: maxGPUs).",
    )
    windows: list[ScheduleWindow] = Field(
        min_length=1, max_length=MAX_WINDOWS, description="The windows (at most 64)."
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Berlin)") from exc
        return value


class ReactiveFallback(KubeModel):
    """KALE's reactive threshold rule, used when the demand query fails or its value jumps:
    one step of ``stepGPUs`` up while the signal is above ``scaleUpAbove``, one step down while
    it is below ``scaleDownBelow`` (unset: never down), else hold."""

    query: str | None = Field(
        default=None,
        max_length=MAX_QUERY_LENGTH,
        description="PromQL of the fallback signal (e.g. consumer lag); unset: the demand query.",
    )
    scale_up_above: float = Field(description="Add a step while the signal is above this.")
    scale_down_below: float | None = Field(
        default=None, description="Remove a step while the signal is below this (unset: never)."
    )
    step_gpus: int = Field(default=1, ge=1, le=100_000, alias="stepGPUs", description="GPUs per step.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.scale_down_below is not None and self.scale_down_below >= self.scale_up_above:
            raise ValueError("fallback.scaleDownBelow must be below fallback.scaleUpAbove")
        return self


class PrometheusDemand(KubeModel):
    """Demand from a PromQL instant query: ``ceil(value / perGPU)`` GPUs."""

    query: str = Field(
        min_length=1,
        max_length=MAX_QUERY_LENGTH,
        description="PromQL returning one sample: the job's input rate, lag …",
    )
    per_gpu: float = Field(gt=0, alias="perGPU", description="The value one GPU serves.")
    jump_ratio: float = Field(
        default=3.0,
        gt=1,
        description="A reading this many times above or below the previous one is a jump: "
        "the reactive fallback decides until a second reading confirms it.",
    )
    fallback: ReactiveFallback | None = Field(
        default=None, description="The reactive threshold fallback (unset: hold while blind)."
    )

    @field_validator("per_gpu", "jump_ratio")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class ForecastDemand(KubeModel):
    """Demand from a seasonal model (daily and weekly seasonality, retrained daily) of the
    job's own demand history, read from Prometheus (``query``, ``perGPU`` as for the
    ``prometheus`` source). The plan takes the upper bound of the prediction interval at
    ``confidence``. While the history is shorter than two days: ``fallbackSchedule`` when
    set, else the last day's shape, else the current value."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_LENGTH, description="PromQL of the demand signal.")
    per_gpu: float = Field(gt=0, alias="perGPU", description="The value one GPU serves.")
    history_days: int = Field(
        default=14, ge=2, le=56, description="Days of history the model is trained on (weekly: >= 14)."
    )
    confidence: float = Field(
        default=0.95, ge=0.5, le=0.999, description="Level of the prediction interval the plan covers."
    )
    fallback_schedule: ScheduleDemand | None = Field(
        default=None, description="Used while the history is too short for the model."
    )


class Demand(KubeModel):
    """Where the demand comes from: exactly one source."""

    schedule: ScheduleDemand | None = None
    prometheus: PrometheusDemand | None = None
    forecast: ForecastDemand | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if sum(x is not None for x in (self.schedule, self.prometheus, self.forecast)) != 1:
            raise ValueError(
                "exactly one of demand.schedule, demand.prometheus and demand.forecast must be set"
            )
        return self

    @property
    def source(self) -> str:
        """``schedule``, ``prometheus`` or ``forecast``."""
        if self.schedule is not None:
            return "schedule"
        return "prometheus" if self.prometheus is not None else "forecast"


class Stabilization(KubeModel):
    """KALE's plan stabilization: a change of at least ``rho`` GPUs lasting less than
    ``tauSeconds`` is flattened to the larger neighbour (:mod:`extender.autopilot.stabilize`)."""

    rho: int = Field(default=1, ge=1, le=100_000, description="Smallest change (GPUs) that is flattened.")
    tau_seconds: int = Field(
        default=600, ge=0, le=86_400, description="Changes lasting less than this are flattened (0: off)."
    )


class GPULeasePolicySpec(KubeModel):
    """What the autopilot may do for one online job (see the module docstring)."""

    owner: str = Field(pattern=OWNER_PATTERN, description="The online job, <namespace>/<job>.")
    min_gpus: int = Field(ge=0, le=100_000, alias="minGPUs", description="Never plan below this.")
    max_gpus: int = Field(
        ge=1, le=100_000, alias="maxGPUs", description="The job's peak allocation; never plan above this."
    )
    demand: Demand
    stabilization: Stabilization = Field(default_factory=Stabilization)
    lead_time: Literal["auto"] | int = Field(
        default="auto",
        description="How early a Reclaim starts before a predicted rise: auto (the prelaunch window W "
        "plus the grace period) or seconds.",
    )
    step_seconds: int = Field(
        default=300, ge=60, le=3600, description="Resolution of the plan (seconds per step)."
    )
    grace_period_seconds: int = Field(
        default=DEFAULT_GRACE_SECONDS,
        ge=MIN_GRACE_SECONDS,
        le=MAX_GRACE_SECONDS,
        description="gracePeriodSeconds of the Reclaim leases the autopilot writes.",
    )
    dry_run: bool = Field(default=False, description="Show the plan in status and write no lease.")

    @field_validator("lead_time")
    @classmethod
    def _lead(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if isinstance(value, int) and not 0 <= value <= MAX_LEAD_SECONDS:
            raise ValueError(f"leadTime must be auto or seconds in [0, {MAX_LEAD_SECONDS}]")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_gpus > self.max_gpus:
            raise ValueError("spec.minGPUs must not exceed spec.maxGPUs")
        return self

    @property
    def namespace(self) -> str:
        """The owner's namespace (where its leases go)."""
        return self.owner.split("/", 1)[0]


# --------------------------------------------------------------------------- status


class DecisionAction(enum.StrEnum):
    """What the autopilot decided: write a ``Lend`` or ``Reclaim`` lease, or ``Hold``."""

    LEND = "Lend"
    RECLAIM = "Reclaim"
    HOLD = "Hold"


class DemandStatus(KubeModel):
    """The demand read at ``observedAt``: GPUs, the raw value for a query, where it came from
    (``schedule``, ``prometheus``, ``forecast``, ``fallback``, ``lastDay``, ``unknown``) and why."""

    gpus: int | None = Field(default=None, description="The demand in GPUs (none when unknown).")
    value: float | None = Field(
        default=None, description="The raw value a Prometheus query or the forecast gave (its own units)."
    )
    source: str = Field(
        description="Where it came from: schedule, prometheus, forecast, fallback, lastDay or unknown."
    )
    observed_at: datetime = Field(description="When it was read (RFC 3339).")
    message: str = Field(default="", description="Why this source, or why the demand is unknown.")


class PlanSegment(KubeModel):
    """From ``start`` until the next segment: ``gpus``."""

    start: datetime = Field(description="When this segment starts (RFC 3339).")
    gpus: int = Field(description="GPUs the job should hold from start until the next segment.")


class PlanStatus(KubeModel):
    """The stabilized plan as change points, the lead time used, and what it means now:
    ``targetGPUs`` (the most the plan needs from now to now + lead time) against
    ``allocatedGPUs`` (what the job's pods hold)."""

    computed_at: datetime = Field(description="When the plan was computed (RFC 3339).")
    step_seconds: int = Field(description="The plan's resolution, seconds per step.")
    lead_time_seconds: float = Field(description="Lead time of a Reclaim used for this plan, seconds.")
    lead_time_source: str = Field(
        default="", description="Where the lead time came from (the prelaunch window, or the spec's seconds)."
    )
    target_gpus: int = Field(
        alias="targetGPUs", description="The most GPUs the plan needs from now to now + lead time."
    )
    allocated_gpus: int | None = Field(
        default=None, alias="allocatedGPUs", description="GPUs the job's pods hold now."
    )
    lent_gpus: int = Field(
        default=0, alias="lentGPUs", description="GPUs the job has lent and not taken back."
    )
    segments: list[PlanSegment] = Field(
        default_factory=list, description="The stabilized plan as change points."
    )


class ForecastStatus(KubeModel):
    """The model's last forecast: point values and the interval's upper bound per step from
    ``start`` (demand units of the query), the model, the history it saw, and the MAPE (0–1)
    of the previous forecast against the day that followed its training."""

    trained_at: datetime = Field(description="When the model was trained (RFC 3339).")
    start: datetime = Field(description="Time of the first forecast step (RFC 3339).")
    step_seconds: int = Field(description="Seconds per forecast step.")
    model: str = Field(description="The forecasting model (statsmodels' MSTL with ETS).")
    history_points: int = Field(description="Points of history the model was trained on.")
    values: list[float] = Field(default_factory=list, description="Point forecast per step (demand units).")
    upper: list[float] = Field(
        default_factory=list, description="Upper bound of the calibrated interval per step (demand units)."
    )
    mape: float | None = Field(
        default=None,
        description="Mean absolute percentage error (ratio 0-1) of the previous forecast against "
        "the day after its training.",
    )
    mape_points: int = Field(default=0, description="Points the MAPE was computed over.")


class Decision(KubeModel):
    """One decision: ``Lend``/``Reclaim`` ``count`` GPUs (``lease`` names the GPULease written;
    none in a dry run) or ``Hold``; ``sequence`` numbers the leases the policy wrote."""

    at: datetime = Field(description="When it was decided (RFC 3339).")
    action: DecisionAction = Field(description="Lend, Reclaim or Hold.")
    count: int = Field(default=0, description="GPUs lent or reclaimed.")
    lease: str | None = Field(default=None, description="The GPULease written (none in a dry run or a Hold).")
    dry_run: bool = Field(default=False, description="The decision was only shown, no lease written.")
    reason: str = Field(default="", description="Why, in words.")
    sequence: int = Field(default=0, description="Sequence number of the leases this policy wrote.")


class GPULeasePolicyStatus(KubeModel):
    """What the lease autopilot saw and decided; written only by it."""

    observed_generation: int | None = Field(
        default=None, description="The spec's metadata.generation this status was computed for."
    )
    demand: DemandStatus | None = Field(default=None, description="The demand last read.")
    plan: PlanStatus | None = Field(default=None, description="The stabilized plan.")
    forecast: ForecastStatus | None = Field(default=None, description="The last forecast (demand.forecast).")
    last_decision: Decision | None = Field(default=None, description="The last decision taken.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Valid, DemandKnown and LeaseInFlight, as metav1.Condition."
    )


class GPULeasePolicy(KubeModel):
    """The ``GPULeasePolicy`` custom resource (namespaced, in the owner's namespace)."""

    api_version: str = keys.API_VERSION
    kind: str = keys.GPULEASEPOLICY_KIND
    metadata: ObjectMeta
    spec: GPULeasePolicySpec
    status: GPULeasePolicyStatus = Field(
        default_factory=GPULeasePolicyStatus, description="Written only by the lease autopilot."
    )


def parse_policy(obj: dict[str, Any]) -> GPULeasePolicy:
    """Validate a ``GPULeasePolicy`` JSON object. Raises ``pydantic.ValidationError``."""
    return GPULeasePolicy.model_validate(obj)
