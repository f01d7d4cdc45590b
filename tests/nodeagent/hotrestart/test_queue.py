from __future__ import annotations

import asyncio

from nodeagent.hotrestart.queue import WorkQueue


async def test_duplicates_collapse_and_a_busy_key_is_requeued_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await q.get() == "a"
    q.add("a")  # while a worker holds it: handed out again only after done
    assert len(q) == 1
    assert await q.get() == "b"
    q.done("b")
    q.done("a")
    assert await asyncio.wait_for(q.get(), 1) == "a"
    q.done("a")
    assert len(q) == 0


async def test_add_after_and_close() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("late", 0.01)
    assert await asyncio.wait_for(q.get(), 1) == "late"
    q.done("late")
    q.add_after("never", 0.01)
    q.close()
    await asyncio.sleep(0.03)
    q.add("ignored")
    assert len(q) == 0
