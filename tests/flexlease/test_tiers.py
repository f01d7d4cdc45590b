from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexlease.api.tiers import Tier, classify


def test_tiers_order_by_reliability_not_text() -> None:
    assert Tier.LA < Tier.MA < Tier.HA
    assert sorted([Tier.HA, Tier.LA, Tier.MA]) == [Tier.LA, Tier.MA, Tier.HA]
    assert max(Tier) is Tier.HA
    assert Tier("HA") >= Tier.MA and not Tier.HA <= Tier.MA
    assert Tier.HA == "HA"  # still a str on the wire


@pytest.mark.parametrize(
    ("ratio", "tier"),
    [(1.0, Tier.HA), (0.9999, Tier.MA), (0.97, Tier.MA), (0.9699, Tier.LA), (0.0, Tier.LA)],
)
def test_paper_thresholds(ratio: float, tier: Tier) -> None:
    assert classify(ratio) is tier


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_classify_is_monotonic(a: float, b: float, ma: float) -> None:
    ha = max(ma, 0.999)
    lo, hi = sorted((a, b))
    assert classify(lo, ha, ma) <= classify(hi, ha, ma)


@pytest.mark.parametrize(("ratio", "ha", "ma"), [(1.1, 1.0, 0.97), (-0.1, 1.0, 0.97), (0.5, 0.9, 0.95)])
def test_bad_input_is_rejected(ratio: float, ha: float, ma: float) -> None:
    with pytest.raises(ValueError):
        classify(ratio, ha, ma)
