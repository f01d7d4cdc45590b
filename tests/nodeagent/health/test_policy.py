"""The XID / ECC / lost-GPU health policy and its recovery hold-down."""

from __future__ import annotations

import pytest

from flexlease.api.resources import Health
from nodeagent.health.backend import DeviceEvent, DeviceSample, EventKind
from nodeagent.health.policy import DEFAULT_APPLICATION_XIDS, HealthPolicy

T0 = 1_000_000.0
POLICY = HealthPolicy(recovery_hold_down_seconds=300.0)


def healthy_at(t: float) -> object:
    return POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=t))


def xid(n: int, at: float = T0 + 10) -> DeviceEvent:
    return DeviceEvent(index=0, kind=EventKind.XID, at=at, xid=n)


def test_starts_unknown_and_turns_healthy_on_the_first_good_query() -> None:
    state = POLICY.initial(T0)
    assert state.health is Health.UNKNOWN
    state = POLICY.on_sample(state, DeviceSample(index=0, at=T0 + 1, temperature_c=40))
    assert state.health is Health.HEALTHY
    assert state.since == T0 + 1
    assert state.reason is None


def test_default_application_xids_match_the_device_plugin() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_APPLICATION_XIDS


@pytest.mark.parametrize("code", sorted(DEFAULT_APPLICATION_XIDS))
def test_application_xids_leave_a_gpu_healthy_but_are_recorded(code: int) -> None:
    state = POLICY.on_event(POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0)), xid(code))
    assert state.health is Health.HEALTHY
    assert state.last_xid == code
    assert state.last_bad_at is None


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 123])
def test_critical_xids_make_a_gpu_unhealthy(code: int) -> None:
    start = POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0))
    state = POLICY.on_event(start, xid(code, at=T0 + 10))
    assert state.health is Health.UNHEALTHY
    assert state.reason == f"XID {code}"
    assert state.since == T0 + 10
    assert state.last_bad_at == T0 + 10
    assert state.last_xid == code


def test_configured_application_xids_replace_the_default() -> None:
    policy = HealthPolicy(application_xids=frozenset({79}))
    start = policy.on_sample(policy.initial(T0), DeviceSample(index=0, at=T0))
    assert policy.on_event(start, xid(79)).health is Health.HEALTHY
    assert policy.on_event(start, xid(13)).health is Health.UNHEALTHY


def test_double_bit_ecc_is_unhealthy_single_bit_is_not() -> None:
    start = POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0))
    dbe = POLICY.on_event(start, DeviceEvent(index=0, kind=EventKind.DOUBLE_BIT_ECC, at=T0 + 5))
    sbe = POLICY.on_event(start, DeviceEvent(index=0, kind=EventKind.SINGLE_BIT_ECC, at=T0 + 5))
    assert (dbe.health, dbe.reason) == (Health.UNHEALTHY, "double-bit ECC error")
    assert sbe == start


def test_lost_gpu_by_event_or_by_query_is_unhealthy() -> None:
    start = POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0))
    by_event = POLICY.on_event(start, DeviceEvent(index=0, kind=EventKind.LOST, at=T0 + 1))
    by_query = POLICY.on_sample(start, DeviceSample(index=0, at=T0 + 1, lost=True))
    for state in (by_event, by_query):
        assert state.health is Health.UNHEALTHY
        assert state.reason == "GPU is lost (fallen off the bus)"


def test_failed_row_remapping_is_unhealthy_pending_is_not() -> None:
    start = POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0))
    failed = POLICY.on_sample(start, DeviceSample(index=0, at=T0 + 1, remapped_rows_failure=True))
    pending = POLICY.on_sample(start, DeviceSample(index=0, at=T0 + 1, remapped_rows_pending=True))
    assert failed.health is Health.UNHEALTHY and failed.reason == "row remapping failed"
    assert pending.health is Health.HEALTHY


def test_recovery_only_after_the_hold_down_counted_from_the_last_bad_observation() -> None:
    start = POLICY.on_sample(POLICY.initial(T0), DeviceSample(index=0, at=T0))
    bad = POLICY.on_event(start, xid(79, at=T0 + 100))
    # still inside the hold-down: stays unhealthy even though queries look fine
    assert POLICY.on_sample(bad, DeviceSample(index=0, at=T0 + 399)).health is Health.UNHEALTHY
    # a second critical XID during the hold-down restarts it
    again = POLICY.on_event(bad, xid(79, at=T0 + 350))
    assert again.since == T0 + 100  # still the same unhealthy stretch
    assert POLICY.on_sample(again, DeviceSample(index=0, at=T0 + 401)).health is Health.UNHEALTHY
    recovered = POLICY.on_sample(again, DeviceSample(index=0, at=T0 + 650))
    assert recovered.health is Health.HEALTHY
    assert recovered.since == T0 + 650
    assert recovered.last_xid == 79


def test_a_lost_gpu_does_not_recover_while_it_stays_lost() -> None:
    policy = HealthPolicy(recovery_hold_down_seconds=60)
    state = policy.on_sample(policy.initial(T0), DeviceSample(index=0, at=T0, lost=True))
    for t in range(1, 10):
        state = policy.on_sample(state, DeviceSample(index=0, at=T0 + t * 100, lost=True))
        assert state.health is Health.UNHEALTHY
    state = policy.on_sample(state, DeviceSample(index=0, at=T0 + 950))
    assert state.health is Health.UNHEALTHY  # last lost at +900: hold-down runs to +960
    assert policy.on_sample(state, DeviceSample(index=0, at=T0 + 960)).health is Health.HEALTHY


def test_zero_hold_down_recovers_at_the_next_good_query() -> None:
    policy = HealthPolicy(recovery_hold_down_seconds=0)
    bad = policy.on_event(policy.initial(T0), xid(79, at=T0 + 1))
    assert policy.on_sample(bad, DeviceSample(index=0, at=T0 + 1)).health is Health.HEALTHY


def test_nvml_down_makes_every_state_unknown_and_keeps_the_hold_down() -> None:
    bad = POLICY.on_event(POLICY.initial(T0), xid(79, at=T0 + 1))
    down = POLICY.on_backend_down(bad, "NVML unavailable: driver not loaded", T0 + 2)
    assert (down.health, down.reason, down.since) == (
        Health.UNKNOWN,
        "NVML unavailable: driver not loaded",
        T0 + 2,
    )
    assert POLICY.on_backend_down(down, "NVML unavailable: driver not loaded", T0 + 9) == down
    # NVML back 100 s later: the GPU is not advertised healthy before the hold-down ends
    back = POLICY.on_sample(down, DeviceSample(index=0, at=T0 + 100))
    assert back.health is Health.UNHEALTHY
    assert POLICY.on_sample(back, DeviceSample(index=0, at=T0 + 301)).health is Health.HEALTHY


def test_resume_after_restart_keeps_the_hold_down_of_an_unhealthy_gpu() -> None:
    state = POLICY.resume(unhealthy_until=T0, now=T0 + 60)
    assert state.health is Health.UNKNOWN
    assert POLICY.on_sample(state, DeviceSample(index=0, at=T0 + 61)).health is Health.UNHEALTHY
    assert POLICY.on_sample(state, DeviceSample(index=0, at=T0 + 300)).health is Health.HEALTHY
    fresh = POLICY.resume(unhealthy_until=None, now=T0)
    assert POLICY.on_sample(fresh, DeviceSample(index=0, at=T0)).health is Health.HEALTHY
