"""Measured throughput (bytes per second) as an exponentially weighted moving average.

Fed by the image puller (registry throughput, ``B_reg``) and the checkpoint cache (storage
throughput, ``B_stor``); read by the prelaunch window. Pure.
"""

from __future__ import annotations

import math

from flexlease.errors import RequestError


class EwmaRate:
    """EWMA of transfer rates. ``alpha`` (0–1] weighs the newest sample; ``value`` is in
    bytes/s, or None before the first sample."""

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise RequestError(f"EwmaRate alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        return self._value

    def observe(self, nbytes: int, seconds: float) -> float | None:
        """Add one transfer of ``nbytes`` bytes that took ``seconds`` seconds. Transfers of 0
        bytes or with no measurable duration carry no rate information and are ignored.
        Returns the new average (bytes/s)."""
        if nbytes < 0 or seconds < 0 or not math.isfinite(seconds):
            raise RequestError(f"EwmaRate.observe: bad sample ({nbytes} bytes, {seconds} s)")
        if nbytes == 0 or seconds <= 0:
            return self._value
        rate = nbytes / seconds
        self._value = rate if self._value is None else self.alpha * rate + (1 - self.alpha) * self._value
        return self._value
