from __future__ import annotations

import pytest

from flexlease.errors import RequestError
from nodeagent.cache.rate import EwmaRate


def test_ewma() -> None:
    r = EwmaRate(alpha=0.5)
    assert r.value is None
    assert r.observe(100, 1.0) == 100.0
    assert r.observe(300, 1.0) == 200.0
    assert r.observe(0, 1.0) == 200.0  # no information
    assert r.observe(10, 0.0) == 200.0


def test_bad_input() -> None:
    with pytest.raises(RequestError):
        EwmaRate(alpha=0)
    with pytest.raises(RequestError):
        EwmaRate().observe(-1, 1.0)
    with pytest.raises(RequestError):
        EwmaRate().observe(1, float("inf"))
