"""The ``GPULeasePolicy`` the simulated online job runs under when the lease autopilot sizes it
(``Scenario.autopilot``; issue #40). Pure.

One policy per mode, each validated through :class:`flexlease.api.policy.GPULeasePolicySpec`:

* ``prometheus``: the job's input rate (:data:`flexlease.sim.demandtrace.DEMAND_QUERY`) at
  ``perGPU`` :data:`~flexlease.sim.demandtrace.PER_GPU`, with KALE's reactive threshold fallback
  (a node's GPUs up while the rate is above half the peak's, down below a quarter of it) for a
  reading that jumps;
* ``forecast``: the same query, the seasonal model on 14 days of history, the upper bound of
  its 95 % interval;
* ``schedule``: the hand-written day an operator would write from Fig. 2: 24 hourly windows,
  each the unshaped Fig. 2 tide's largest demand within the hour, rounded up to whole GPUs.

``minGPUs`` is one node's GPUs, ``maxGPUs`` the job's peak; ``leadTime`` is
``Scenario.autopilot_lead`` seconds (the simulation publishes no prelaunch inputs, so ``auto``
would count the grace period only); stabilization is the CRD's default (ρ = 1, τ = 10 min).
"""

from __future__ import annotations

import math
from typing import Any, Final

from flexlease.api import keys
from flexlease.api.policy import GPULeasePolicySpec
from flexlease.sim import demandtrace, tide
from flexlease.sim.scenario import Scenario
from flexlease.store.base import JsonObj

POLICY_NAME: Final = "trainer"


def hourly_windows(peak_gpus: int) -> list[dict[str, Any]]:
    """24 windows ``HH:00``–``HH+1:00`` (the last across midnight), each with the largest
    demand of the unshaped Fig. 2 tide within the hour (sampled every minute), in GPUs."""
    curve = tide.Tide()
    windows: list[dict[str, Any]] = []
    for hour in range(24):
        top = max(curve.demand(hour * 3600.0 + m * 60.0) for m in range(61))
        windows.append(
            {
                "start": f"{hour:02d}:00",
                "end": f"{(hour + 1) % 24:02d}:00",
                "gpus": math.ceil(top * peak_gpus - 1e-9),
            }
        )
    return windows


def demand_spec(mode: str, scenario: Scenario) -> dict[str, Any]:
    """``spec.demand`` of the policy for ``mode`` (``prometheus``, ``forecast``, ``schedule``).
    Raises ``ValueError`` for another mode."""
    peak = scenario.job_gpus
    if mode == "prometheus":
        return {
            "prometheus": {
                "query": demandtrace.DEMAND_QUERY,
                "perGPU": demandtrace.PER_GPU,
                "fallback": {
                    "scaleUpAbove": 0.5 * peak * demandtrace.PER_GPU,
                    "scaleDownBelow": 0.25 * peak * demandtrace.PER_GPU,
                    "stepGPUs": scenario.gpus_per_node,
                },
            }
        }
    if mode == "forecast":
        return {
            "forecast": {
                "query": demandtrace.DEMAND_QUERY,
                "perGPU": demandtrace.PER_GPU,
                "historyDays": 14,
                "confidence": 0.95,
            }
        }
    if mode == "schedule":
        return {"schedule": {"timeZone": "UTC", "windows": hourly_windows(peak)}}
    raise ValueError(f"no GPULeasePolicy for autopilot mode {mode!r}")


def policy_object(mode: str, scenario: Scenario, *, owner: str) -> JsonObj:
    """The ``GPULeasePolicy`` of the job ``owner`` (``<namespace>/<job>``) for ``mode``,
    validated (raises ``pydantic.ValidationError`` when a scenario makes it invalid)."""
    namespace = owner.split("/", 1)[0]
    spec = {
        "owner": owner,
        "minGPUs": min(scenario.gpus_per_node, scenario.job_gpus),
        "maxGPUs": scenario.job_gpus,
        "demand": demand_spec(mode, scenario),
        "leadTime": scenario.autopilot_lead,
        "gracePeriodSeconds": scenario.grace_period_seconds,
    }
    GPULeasePolicySpec.model_validate(spec)
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPULEASEPOLICY_KIND,
        "metadata": {"name": POLICY_NAME, "namespace": namespace},
        "spec": spec,
    }
