"""flexlease.sim.tiering: availability and tiers as the node agent computes them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flexlease.api.tiers import Tier
from flexlease.sim import tiering
from flexlease.sim.tiering import GpuTier, TierPolicy

DAY = 86400.0
POLICY = TierPolicy(window=14 * DAY, refresh=DAY)


def test_availability_over_the_window() -> None:
    outs = ((-20 * DAY, -20 * DAY + 3600), (DAY, DAY + 3600))
    a = tiering.availability(outs, 2 * DAY, POLICY)
    assert a.window_seconds == a.observed_seconds == 14 * DAY
    assert a.unavailable_seconds == 3600
    assert a.ratio == 1 - 3600 / (14 * DAY)


def test_tiers_follow_fig5_thresholds() -> None:
    assert tiering.tier_at((), 0, POLICY) is Tier.HA
    assert tiering.tier_at(((0.0, 3600.0),), DAY, POLICY) is Tier.MA  # 1 h of 14 days
    assert tiering.tier_at(((0.0, 11 * 3600.0),), DAY, POLICY) is Tier.LA  # > 3 % (10.08 h)
    assert tiering.tier_at(((0.0, 3600.0),), 15 * DAY, POLICY) is Tier.HA  # left the window


def test_downgrade_is_immediate_and_never_upgrades() -> None:
    outs = ((DAY, DAY + 12 * 3600),)
    start = tiering.refreshed(outs, DAY, POLICY)
    assert start.tier is Tier.HA
    mid = tiering.downgraded(start, outs, DAY + 600, POLICY)
    assert mid.tier is Tier.MA and mid.computed_at == DAY + 600
    late = tiering.downgraded(mid, outs, DAY + 12 * 3600, POLICY)
    assert late.tier is Tier.LA
    assert tiering.downgraded(late, outs, 20 * DAY, POLICY) == late  # only a refresh upgrades
    assert tiering.refreshed(outs, 20 * DAY, POLICY).tier is Tier.HA


@given(
    tier=st.sampled_from(list(Tier)),
    start=st.floats(0, 20 * DAY),
    length=st.floats(0, 5 * DAY),
    t=st.floats(0, 30 * DAY),
)
def test_downgraded_never_raises_a_tier(tier: Tier, start: float, length: float, t: float) -> None:
    current = GpuTier(tier, 0.0)
    assert tiering.downgraded(current, ((start, start + length),), t, POLICY).tier <= tier


def test_refresh_due() -> None:
    assert tiering.is_refresh_due(0, DAY, POLICY)
    assert not tiering.is_refresh_due(0, DAY - 1, POLICY)
