"""Waiting on a condition in the hack scripts (the demo, the GPU check): poll until it holds.

Pure asyncio, no I/O of its own. Neighbours: :mod:`hack.demo`, :mod:`hack.gpu_check`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

_T = TypeVar("_T")


async def poll(
    what: str,
    probe: Callable[[], Awaitable[_T | None]],
    *,
    limit_s: float,
    interval_s: float,
    error: Callable[[str], Exception] = TimeoutError,
) -> _T:
    """``await probe()`` every ``interval_s`` seconds until it returns a truthy value, which is
    returned. Raises ``error("timed out waiting for <what>")`` once ``limit_s`` seconds (real
    time) have passed without one."""
    deadline = time.monotonic() + limit_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {limit_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
