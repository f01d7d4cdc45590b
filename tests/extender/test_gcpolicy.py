"""The garbage-collector policy: the listed inventory is frozen once, after the initial list."""

from __future__ import annotations

import asyncio
import gc
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
    gc.unfreeze()
    gc.set_threshold(*threshold)


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
