"""Suite-wide strictness (after kopf's tests/conftest.py): warnings are errors (pyproject),
every test ends with no asyncio task of its own still running, and logging is configured
after each test as it was before it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running after it (and its fixtures) finished."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()]
    if leaked:
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(f"test leaked asyncio tasks: {[t.get_name() for t in leaked]}")


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo what :func:`flexlease.logging.setup` changes (a test may run a ``main`` in the
    pytest process): the root logger's handlers and level, and the module switches it turns
    off (``logThreads``, ``logProcesses``, ``logMultiprocessing``, ``_srcfile``)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    switches = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing, logging._srcfile)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.logThreads, logging.logProcesses, logging.logMultiprocessing, logging._srcfile = switches
