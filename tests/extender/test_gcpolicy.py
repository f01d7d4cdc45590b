"""The garbage-collector policy: the listed inventory is frozen once, after the initial list,
and what survives a generation-1 collection later is frozen as that collection ends."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from aiohttp.pytest_plugin import AiohttpClient

from extender import gcpolicy, server
from flexlease.store.memory import MemoryStore
from tests.extender import payloads
from tests.extender.conftest import add_node, eventually, make_settings


@pytest.fixture
def collector() -> Iterator[None]:
    """Give the test process its collector back as it was (the policy is process-wide)."""
    threshold = gc.get_threshold()
    yield
    while gcpolicy.freeze_survivors in gc.callbacks:
        gc.callbacks.remove(gcpolicy.freeze_survivors)
    gc.unfreeze()
    gc.set_threshold(*threshold)
    gc.enable()


class _Node:
    """A tracked object that can be referred to weakly and be part of a cycle."""

    def __init__(self) -> None:
        self.other: object = None


async def test_inventory_is_frozen_once_listed(
    aiohttp_client: AiohttpClient, store: MemoryStore, collector: None
) -> None:
    await add_node(store, payloads.gpunode("gpu-a"))
    app = server.create_app(
        make_settings(), store, extra_contexts=[gcpolicy.cleanup_ctx(gen0_threshold=12_345, gen1_threshold=4)]
    )
    await aiohttp_client(app)
    inv = app[server.INVENTORY]
    await eventually(lambda: inv.ready and gc.get_threshold()[:2] == (12_345, 4))
    view = inv.snapshot().nodes["gpu-a"]
    assert gc.get_freeze_count() > 0
    # Frozen objects sit in the permanent generation, which no collection traverses.
    assert all(obj is not view for obj in gc.get_objects())
    task = next(t for t in asyncio.all_tasks() if t.get_name() == "extender-gc-freeze")
    assert not task.done()  # owned until cleanup, not ended (which would be logged)


async def test_freeze_waits_for_the_initial_list(
    aiohttp_client: AiohttpClient, store: MemoryStore, collector: None
) -> None:
    app = server.create_app(make_settings(), store, extra_contexts=[gcpolicy.cleanup_ctx(gen0_threshold=777)])
    app[server.INVENTORY].replace_nodes([])  # GPUNodes listed, Pods not: not ready
    app.cleanup_ctx.clear()
    app.cleanup_ctx.append(gcpolicy.cleanup_ctx(gen0_threshold=777))
    await aiohttp_client(app)
    await asyncio.sleep(3 * gcpolicy.POLL_SECONDS)
    assert gc.get_threshold()[0] != 777
    app[server.INVENTORY].replace_pods([])
    await eventually(lambda: gc.get_threshold()[0] == 777)


async def test_survivors_of_a_generation_1_collection_are_frozen_until_cleanup(
    aiohttp_client: AiohttpClient, store: MemoryStore, collector: None
) -> None:
    app = server.create_app(make_settings(), store, extra_contexts=[gcpolicy.cleanup_ctx()])
    client = await aiohttp_client(app)
    await eventually(lambda: gcpolicy.freeze_survivors in gc.callbacks)
    gc.disable()  # no automatic collection between the steps below (the fixture enables it)
    kept = _Node()  # created after the freeze: young
    assert any(obj is kept for obj in gc.get_objects(0))
    gc.collect(0)  # a young collection promotes it, and freezes nothing
    assert any(obj is kept for obj in gc.get_objects(1))
    gc.collect(1)  # it survives a generation-1 collection: frozen as that collection ends
    assert all(obj is not kept for obj in gc.get_objects())

    # Young cycles are still collected: the policy freezes only what survived generation 1.
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None
    gc.collect(0)
    assert gone() is None

    await client.close()
    assert gcpolicy.freeze_survivors not in gc.callbacks
    gc.collect(1)  # after cleanup, survivors stay in the collector's generations
    later = _Node()
    gc.collect(1)
    assert any(obj is later for obj in gc.get_objects(2))


def test_freeze_survivors_acts_only_when_a_generation_1_or_full_collection_ends(collector: None) -> None:
    gc.disable()
    obj = _Node()
    for phase, generation in (("start", 1), ("start", 2), ("stop", 0)):
        gcpolicy.freeze_survivors(phase, {"generation": generation, "collected": 0, "uncollectable": 0})
        assert any(o is obj for o in gc.get_objects())
    gcpolicy.freeze_survivors("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    assert all(o is not obj for o in gc.get_objects())


async def test_survivors_stay_collectable_when_the_setting_says_so(
    aiohttp_client: AiohttpClient, store: MemoryStore, collector: None
) -> None:
    app = server.create_app(
        make_settings(), store, extra_contexts=[gcpolicy.cleanup_ctx(gen0_threshold=4_321, survivors=False)]
    )
    await aiohttp_client(app)
    await eventually(lambda: gc.get_threshold()[0] == 4_321)
    assert gcpolicy.freeze_survivors not in gc.callbacks
