"""KALE's plan stabilization (SoCC '24): short changes are flattened to the larger neighbour."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.autopilot.stabilize import segments, stabilize

TEN_MIN = 600.0


def test_kale_worked_example() -> None:
    """[4, 4, 5, 6, 6, 6] at 10-minute steps with tau = 15 min becomes [4, 4, 6, 6, 6, 6]."""
    assert stabilize([4, 4, 5, 6, 6, 6], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [4, 4, 6, 6, 6, 6]


def test_a_short_dip_lends_nothing() -> None:
    assert stabilize([8, 8, 4, 8, 8], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [8, 8, 8, 8, 8]
    # a dip that lasts tau or longer is a real trough
    assert stabilize([8, 8, 4, 4, 8], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [8, 8, 4, 4, 8]


def test_changes_smaller_than_rho_stay() -> None:
    assert stabilize([8, 8, 7, 8, 8], step_seconds=TEN_MIN, rho=2, tau_seconds=900) == [8, 8, 7, 8, 8]
    assert stabilize([8, 8, 6, 8, 8], step_seconds=TEN_MIN, rho=2, tau_seconds=900) == [8, 8, 8, 8, 8]


def test_a_short_spike_is_kept_and_the_edges_are_never_flattened() -> None:
    """Lowering a spike would plan below the demand; the first and last segments have unknown
    length."""
    assert stabilize([4, 4, 9, 4, 4], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [4, 4, 9, 4, 4]
    assert stabilize([2, 8, 8, 8], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [2, 8, 8, 8]
    assert stabilize([8, 8, 8, 2], step_seconds=TEN_MIN, rho=1, tau_seconds=900) == [8, 8, 8, 2]


def test_nested_short_dips_are_flattened_to_the_surrounding_level() -> None:
    assert stabilize([8, 8, 2, 3, 8, 8], step_seconds=TEN_MIN, rho=1, tau_seconds=1500) == [8] * 6


def test_tau_zero_turns_it_off() -> None:
    assert stabilize([8, 4, 8], step_seconds=TEN_MIN, rho=1, tau_seconds=0) == [8, 4, 8]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="rho >= 1"):
        stabilize([1], step_seconds=TEN_MIN, rho=0, tau_seconds=1)


@given(st.lists(st.integers(0, 20), max_size=40), st.integers(1, 4), st.integers(0, 5))
def test_never_below_the_plan_and_no_short_interior_segment_left(
    plan: list[int], rho: int, tau_steps: int
) -> None:
    out = stabilize(plan, step_seconds=TEN_MIN, rho=rho, tau_seconds=tau_steps * TEN_MIN)
    assert len(out) == len(plan)
    assert all(o >= p for o, p in zip(out, plan, strict=True))
    runs = segments(out)
    for i in range(1, len(runs) - 1):
        value, steps = runs[i]
        larger = max(runs[i - 1][0], runs[i + 1][0])
        assert steps >= tau_steps or larger - value < rho
