"""The prometheus source's arithmetic: ceil(value / perGPU), jumps, the reactive fallback."""

from __future__ import annotations

import math

import pytest

from extender.autopilot.promql import gpus_for, is_jump, reactive
from flexlease.api.policy import ReactiveFallback


@pytest.mark.parametrize(
    ("value", "per_gpu", "gpus"),
    [
        (0.0, 100, 0),
        (-3.0, 100, 0),
        (1.0, 100, 1),
        (100.0, 100, 1),
        (100.5, 100, 2),
        (1.1, 0.1, 11),
        (2500, 250, 10),
    ],
)
def test_ceil_of_value_per_gpu(value: float, per_gpu: float, gpus: int) -> None:
    assert gpus_for(value, per_gpu) == gpus


def test_a_value_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        gpus_for(math.nan, 1)


def test_jumps() -> None:
    assert not is_jump(100, None, ratio=3)
    assert not is_jump(290, 100, ratio=3)
    assert is_jump(310, 100, ratio=3)
    assert is_jump(30, 100, ratio=3)
    assert is_jump(0, 50, ratio=3)
    assert not is_jump(0, 0.2, ratio=3)


RULE = ReactiveFallback(scale_up_above=1000, scale_down_below=100, step_gpus=2)


def test_reactive_steps_from_the_allocation() -> None:
    assert reactive(5000, RULE, allocated=8).gpus == 10
    assert reactive(50, RULE, allocated=8).gpus == 6
    assert reactive(500, RULE, allocated=8).gpus == 8
    assert reactive(50, RULE, allocated=1).gpus == 0
    assert reactive(None, RULE, allocated=8).gpus is None
    assert reactive(5000, None, allocated=8).gpus is None
    up_only = ReactiveFallback(scale_up_above=1000)
    assert reactive(0, up_only, allocated=8).gpus == 8
