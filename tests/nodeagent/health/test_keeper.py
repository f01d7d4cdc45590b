"""The ledger keeper stopped while its periodic write is still running in a worker thread (a
slow disk): the final write must neither share that write's temp file nor be overwritten by
it, so the ledger the next start reads holds the whole history."""

from __future__ import annotations

import asyncio
import builtins
import threading
from pathlib import Path
from typing import Any

import pytest

from flexlease.api.resources import Health
from flexlease.clock import ManualClock
from flexlease.store.memory import MemoryStore
from nodeagent.health.keeper import LedgerKeeper
from nodeagent.ledger import Identity, LedgerFile, Span
from tests.nodeagent.health.kit import START, make_context, make_settings, node_config


class _SlowWrites:
    """``open`` for the test: a ledger temp file opened by a worker thread (the keeper's
    periodic write) is slow to take its bytes — its first ``write`` waits for :attr:`release`,
    as a write stuck on a slow disk between ``open(O_TRUNC)`` and ``write``."""

    def __init__(self) -> None:
        self.real_open = builtins.open
        self.entered = threading.Event()
        self.release = threading.Event()
        self.written = threading.Event()

    def __call__(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = self.real_open(file, mode, *args, **kwargs)
        slow = (
            isinstance(file, str | Path)
            and Path(file).name.startswith(".ledger.json.tmp")
            and threading.current_thread() is not threading.main_thread()
            and not self.entered.is_set()
        )
        return _Slow(f, self) if slow else f


class _Slow:
    def __init__(self, inner: Any, gate: _SlowWrites) -> None:
        self._inner = inner
        self._gate = gate
        self._waited = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> _Slow:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)

    def write(self, data: bytes) -> int:
        if not self._waited:
            self._waited = True
            self._gate.entered.set()
            assert self._gate.release.wait(10), "the test never released the slow write"
        n: int = self._inner.write(data)
        self._gate.written.set()
        return n


async def test_stopping_during_a_slow_periodic_write_keeps_a_whole_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(START)
    ctx, _ = await make_context(make_settings(tmp_path), MemoryStore(), clock, node_config(2))
    book = ctx.board.ledger
    book.adopt([(i, Identity(uuid=f"GPU-{i}", model="NVIDIA H20")) for i in range(2)], START)
    for i in range(2):
        book.record(i, Health.HEALTHY, at=START)
    slow = _SlowWrites()
    monkeypatch.setattr(builtins, "open", slow)

    keeper = LedgerKeeper()
    task = asyncio.create_task(keeper.run(ctx), name="test:ledger")
    assert await asyncio.to_thread(slow.entered.wait, 10)  # the periodic write is stuck mid-way
    # Meanwhile GPU 0 fails and recovers: the final write has more to say than the periodic one.
    stamps = [START + 60 * k for k in range(1, 9)]
    for k, at in enumerate(stamps):
        book.record(0, Health.UNHEALTHY if k % 2 == 0 else Health.HEALTHY, at=at)
    clock.jump(stamps[-1] + 30)
    timer = threading.Timer(0.3, slow.release.set)  # the disk catches up while the agent stops
    timer.start()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await asyncio.to_thread(slow.written.wait, 10)
    for _ in range(200):  # the worker thread finishes its write (or its failed rename)
        if not list(ctx.ledger_file.dir.glob(".ledger.json.tmp*")):
            break
        await asyncio.sleep(0.01)
    monkeypatch.undo()

    moved: list[Path] = []
    decoded = LedgerFile(ctx.ledger_file.dir, on_corrupt=lambda path, _why: moved.append(path)).load()
    assert not moved, f"the ledger was corrupt: {moved[0].read_bytes()[:200]!r}"
    assert decoded is not None and decoded.written_at == stamps[-1] + 30  # the final write's
    starts = [iv.start for iv in decoded.devices[0].intervals if iv.state is Span.UNHEALTHY]
    assert starts == stamps[0::2]  # every failure recorded before the stop is there
    assert [p.name for p in ctx.ledger_file.dir.iterdir()] == ["ledger.json"]
