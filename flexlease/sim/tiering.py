"""Per-GPU availability and tier over the rolling window, as the node agent computes them (pure).

The simulator stands in for the node agents (DESIGN §4): availability is
``1 − unavailable/observed`` over the last ``window`` seconds, the tier is
:func:`flexlease.api.tiers.classify` of it, recomputed every refresh period, and immediately
downgraded (never upgraded) while an outage is under way. The simulated history starts one
window before t = 0, so ``observed == window`` throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexlease.api import resources
from flexlease.api.tiers import Tier, classify
from flexlease.sim import failures


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """Window and refresh period (seconds) and thresholds (ratio 0–1), as ``TierSettings``."""

    window: float = 14 * 86400.0
    refresh: float = 86400.0
    ha_threshold: float = 1.0
    ma_threshold: float = 0.97

    def __post_init__(self) -> None:
        if self.window <= 0 or self.refresh <= 0:
            raise ValueError("window and refresh must be positive")


@dataclass(frozen=True, slots=True)
class GpuTier:
    """One GPU's tier and when it was computed (s since start)."""

    tier: Tier
    computed_at: float


def availability(
    outages: tuple[failures.Interval, ...], t: float, policy: TierPolicy
) -> resources.Availability:
    """Availability over ``[t − window, t)`` (seconds; ratio 0–1)."""
    down = min(policy.window, failures.downtime(outages, t - policy.window, t))
    return resources.Availability(
        window_seconds=policy.window,
        observed_seconds=policy.window,
        unavailable_seconds=down,
        ratio=max(0.0, 1.0 - down / policy.window),
    )


def tier_at(outages: tuple[failures.Interval, ...], t: float, policy: TierPolicy) -> Tier:
    """The tier a refresh at ``t`` computes."""
    return classify(availability(outages, t, policy).ratio, policy.ha_threshold, policy.ma_threshold)


def refreshed(outages: tuple[failures.Interval, ...], t: float, policy: TierPolicy) -> GpuTier:
    """The periodic recomputation at ``t``."""
    return GpuTier(tier_at(outages, t, policy), t)


def downgraded(
    current: GpuTier, outages: tuple[failures.Interval, ...], t: float, policy: TierPolicy
) -> GpuTier:
    """``current`` lowered to the tier computed at ``t`` if that is lower; otherwise unchanged."""
    now = tier_at(outages, t, policy)
    return GpuTier(now, t) if now < current.tier else current


def is_refresh_due(last: float, t: float, policy: TierPolicy) -> bool:
    """True when a refresh period has passed since ``last``."""
    return t - last >= policy.refresh
