"""Prometheus metrics of the lease autopilot (prefix ``flexlease_autopilot_``), on an injected
``CollectorRegistry``. Labelled by ``policy`` (``<namespace>/<name>``: one series per
GPULeasePolicy, a handful per cluster); a deleted policy's series are removed."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

DEMAND: Final = "flexlease_autopilot_demand_gpus"
TARGET: Final = "flexlease_autopilot_target_gpus"
ALLOCATED: Final = "flexlease_autopilot_allocated_gpus"
LENT: Final = "flexlease_autopilot_lent_gpus"
LEAD: Final = "flexlease_autopilot_lead_time_seconds"
MAPE: Final = "flexlease_autopilot_forecast_mape_ratio"
DECISIONS: Final = "flexlease_autopilot_decisions"
FALLBACKS: Final = "flexlease_autopilot_demand_fallbacks"
RECONCILE_ERRORS: Final = "flexlease_autopilot_reconcile_errors"


class AutopilotMetrics:
    """The autopilot's metrics (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.demand = Gauge(
            DEMAND, "GPUs the policy's demand source asks for now.", ["policy"], registry=registry
        )
        self.target = Gauge(
            TARGET,
            "The plan's target: the most it needs from now to now + lead time.",
            ["policy"],
            registry=registry,
        )
        self.allocated = Gauge(ALLOCATED, "GPUs the owner's pods hold.", ["policy"], registry=registry)
        self.lent = Gauge(
            LENT, "GPUs of the owner out on loan (tagged, not held by it).", ["policy"], registry=registry
        )
        self.lead = Gauge(LEAD, "Lead time of a Reclaim (seconds).", ["policy"], registry=registry)
        self.mape = Gauge(
            MAPE,
            "MAPE (0-1) of the last forecast against the day that followed.",
            ["policy"],
            registry=registry,
        )
        self.decisions = Counter(
            DECISIONS,
            "Lend and Reclaim decisions (a lease written, or shown only in a dry run).",
            ["policy", "action", "dry_run"],
            registry=registry,
        )
        self.fallbacks = Counter(
            FALLBACKS,
            "Readings where the demand source fell back (reactive rule, schedule) or was unknown.",
            ["policy", "reason"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            RECONCILE_ERRORS, "Policy reconciles that failed (retried with back-off).", registry=registry
        )
        self._gauges = (self.demand, self.target, self.allocated, self.lent, self.lead, self.mape)

    def forget(self, policy: str) -> None:
        """Drop the gauges of a deleted policy (counters keep their history)."""
        for gauge in self._gauges:
            try:
                gauge.remove(policy)
            except KeyError:
                continue
