"""flexlease.sim.leasepolicy: the GPULeasePolicy the simulated job runs under, per mode."""

from __future__ import annotations

import pytest

from flexlease.api.policy import parse_policy
from flexlease.sim import leasepolicy, tide
from flexlease.sim.demandtrace import DEMAND_QUERY, PER_GPU
from flexlease.sim.scenario import Scenario


@pytest.mark.parametrize("mode", ["prometheus", "forecast", "schedule"])
def test_each_mode_gives_a_valid_policy_for_the_job(mode: str) -> None:
    scenario = Scenario(nodes=4, autopilot=mode, autopilot_lead=900)
    obj = leasepolicy.policy_object(mode, scenario, owner="online/trainer")
    policy = parse_policy({**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}})
    spec = policy.spec
    assert (spec.owner, spec.min_gpus, spec.max_gpus) == ("online/trainer", 8, scenario.job_gpus)
    assert spec.lead_time == 900
    assert spec.demand.source == mode
    if mode != "schedule":
        source = spec.demand.prometheus or spec.demand.forecast
        assert source is not None
        assert (source.query, source.per_gpu) == (DEMAND_QUERY, PER_GPU)


def test_the_schedule_is_the_fig2_tide_by_the_hour_rounded_up() -> None:
    windows = leasepolicy.hourly_windows(16)
    assert len(windows) == 24
    assert windows[-1] == {"start": "23:00", "end": "00:00", "gpus": windows[-1]["gpus"]}  # across midnight
    curve = tide.Tide()
    for hour, w in enumerate(windows):
        assert w["gpus"] >= curve.demand(hour * 3600.0) * 16
        assert w["gpus"] >= curve.demand(hour * 3600.0 + 3599.0) * 16
    assert min(w["gpus"] for w in windows) == 7  # ceil(0.39 * 16) at the 03:00 trough
    assert max(w["gpus"] for w in windows) == 15  # ceil(0.92 * 16) at the 15:00 peak


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPULeasePolicy"):
        leasepolicy.demand_spec("off", Scenario(nodes=4))
