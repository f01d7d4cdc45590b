"""The forecast model on synthetic seasonal series with a known answer: MAPE bounded on held-out
days, the upper bound covers what it promises, short histories fall back; MAPE arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from extender.autopilot.forecast import DAY, Forecast, last_day, mape, regular, train

HOUR = 3600.0
START = 1_780_000_000.0


def truth(t: np.ndarray) -> np.ndarray:
    """Requests per second of a recommendation job: a daily tide (peak in the evening) and a
    weekend uplift."""
    hours = (t % DAY) / HOUR
    weekend = ((t // DAY) % 7) >= 5
    return 1000 + 400 * np.sin(2 * np.pi * (hours - 9) / 24) + 250 * weekend


def series(days: float, *, step: float, seed: int, noise: float = 30.0) -> tuple[np.ndarray, np.ndarray]:
    t = START + step * np.arange(int(days * DAY / step))
    rng = np.random.default_rng(seed)
    return t, truth(t) + rng.normal(0, noise, len(t))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mape_on_two_held_out_days_and_upper_bound_coverage(seed: int) -> None:
    """Three weeks of hourly history (daily and weekly seasonality both used), two held-out
    days: MAPE under 5 % (the noise alone costs 2–3 %), the 95 % bound above >= 85 % of the
    points."""
    t, y = series(23, step=HOUR, seed=seed)
    train_n = int(21 * DAY / HOUR)
    history = list(zip(t[:train_n].tolist(), y[:train_n].tolist(), strict=True))
    forecast = train(history, step_seconds=HOUR, horizon_seconds=2 * DAY, confidence=0.95)
    assert forecast is not None
    assert forecast.model.startswith("MSTL(daily+weekly)+ETS(A,Ad,N)")
    assert forecast.start == t[train_n]
    held_out = list(zip(t[train_n:].tolist(), y[train_n:].tolist(), strict=True))
    error, points = mape(forecast, held_out, since=t[train_n], until=t[-1] + 1)
    assert points == 48
    assert error is not None and error < 0.05
    covered = np.mean([v <= forecast.upper_at(when) for when, v in held_out])  # type: ignore[operator]
    assert covered >= 0.85


def test_short_histories_fall_back() -> None:
    t, y = series(2.5, step=HOUR, seed=3)
    history = list(zip(t.tolist(), y.tolist(), strict=True))
    assert train(history, step_seconds=HOUR, horizon_seconds=DAY, confidence=0.95) is None
    shape = last_day(history, step_seconds=HOUR, horizon_seconds=2 * DAY)
    assert shape is not None and shape.model == "last day's shape"
    assert len(shape.values) == 48 and shape.values[:24] == shape.values[24:]
    assert shape.values[0] == pytest.approx(y[-24])
    assert last_day(history[:20], step_seconds=HOUR, horizon_seconds=DAY) is None


def test_regular_fills_gaps_and_ends_at_the_last_sample() -> None:
    grid = regular([(0.0, 0.0), (10.0, 10.0), (40.0, 40.0)], step_seconds=10)
    assert grid is not None
    y, end = grid
    assert end == 40.0 and y.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert regular([(0.0, 1.0)], step_seconds=10) is None


def test_mape_counts_covered_nonzero_points() -> None:
    forecast = Forecast(
        start=100, step_seconds=10, values=(10, 20, 30), upper=(11, 22, 33), model="m", history_points=5
    )
    actual = [(95.0, 5.0), (100.0, 8.0), (110.0, 0.0), (125.0, 40.0), (130.0, 1.0)]
    error, points = mape(forecast, actual, since=0, until=200)
    assert points == 2  # 95 before start, 110 is 0, 130 past the end
    assert error == pytest.approx((2 / 8 + 10 / 40) / 2)
    assert mape(forecast, [], since=0, until=1) == (None, 0)
    assert forecast.value_at(99) == 10 and forecast.upper_at(125) == 33 and forecast.value_at(130) is None
