"""Reliability tiers HA / MA / LA and their classification (WeFlex §3.5, Fig. 5).

HA = 100 % availability over the window, MA = 97–100 %, LA < 97 %. Ordered ``LA < MA < HA``.
Pure; no I/O.
"""

from __future__ import annotations

import enum
from typing import Final


class Tier(enum.StrEnum):
    """A GPU's reliability tier. Compares by reliability (``Tier.LA < Tier.HA``), not by text."""

    LA = "LA"
    MA = "MA"
    HA = "HA"

    @property
    def rank(self) -> int:
        """0 for LA, 1 for MA, 2 for HA."""
        return _RANK[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank >= other.rank

    __hash__ = enum.StrEnum.__hash__


_RANK: Final = {Tier.LA: 0, Tier.MA: 1, Tier.HA: 2}

DEFAULT_HA_THRESHOLD: Final = 1.0
DEFAULT_MA_THRESHOLD: Final = 0.97


def classify(
    ratio: float,
    ha_threshold: float = DEFAULT_HA_THRESHOLD,
    ma_threshold: float = DEFAULT_MA_THRESHOLD,
) -> Tier:
    """Tier for an availability ratio (0–1) over the window.

    ``ratio >= ha_threshold`` → HA (default 1.0, i.e. 100 %), ``ratio >= ma_threshold`` → MA
    (default 0.97), otherwise LA. Raises ``ValueError`` if ratio is outside 0–1 or the
    thresholds are not ordered ``0 <= ma <= ha <= 1``.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"availability ratio must be within 0..1, got {ratio!r}")
    if not 0.0 <= ma_threshold <= ha_threshold <= 1.0:
        raise ValueError(f"thresholds must satisfy 0 <= ma ({ma_threshold}) <= ha ({ha_threshold}) <= 1")
    if ratio >= ha_threshold:
        return Tier.HA
    if ratio >= ma_threshold:
        return Tier.MA
    return Tier.LA
