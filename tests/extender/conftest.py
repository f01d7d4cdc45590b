"""Fixtures for the extender: a MemoryStore seeded with real-shaped objects, the real app
served over HTTP by pytest-aiohttp, and helpers that wait for the watch to catch up."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from extender import server
from flexlease.config import ExtenderSettings, Settings, StoreSettings
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.memory import MemoryStore

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


async def eventually(predicate: Callable[[], bool], *, within: float = 5.0) -> None:
    """Wait until ``predicate()`` holds (the watch is asynchronous); fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def add_node(store: Store, obj: JsonObj) -> JsonObj:
    """Create a GPUNode and write its status through the status subresource, as its agent does."""
    body = copy.deepcopy(obj)
    status = body.pop("status", None)
    body["metadata"].pop("resourceVersion", None)
    body["metadata"].pop("uid", None)
    created = await store.create(Kind.GPUNODE, body)
    if status:
        created = await store.patch(
            Kind.GPUNODE, obj["metadata"]["name"], {"status": status}, subresource="status"
        )
    return created


async def add_pod(store: Store, obj: JsonObj) -> JsonObj:
    """Create a Pod (the store assigns its uid) and write its status; returns the stored pod."""
    body = copy.deepcopy(obj)
    status = body.pop("status", None)
    body["metadata"].pop("resourceVersion", None)
    body["metadata"].pop("uid", None)
    created = await store.create(Kind.POD, body)
    meta = created["metadata"]
    if status:
        created = await store.patch(
            Kind.POD, meta["name"], {"status": status}, namespace=meta["namespace"], subresource="status"
        )
    return created


def make_settings(**extender: Any) -> Settings:
    return Settings(
        log_format="text",
        store=StoreSettings(kind="memory"),
        extender=ExtenderSettings(host="127.0.0.1", port=0, **extender),
    )


@pytest.fixture
def settings() -> Settings:
    return make_settings()


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def start(
    aiohttp_client: ClientFactory, settings: Settings, store: MemoryStore, registry: CollectorRegistry
) -> Callable[..., Awaitable[TestClient[web.Request, web.Application]]]:
    """Start the real app over the store (seed the store first); waits until ready."""

    async def go(
        *, wait_ready: bool = True, app_settings: Settings | None = None
    ) -> TestClient[web.Request, web.Application]:
        app = server.create_app(app_settings or settings, store, registry=registry)
        client = await aiohttp_client(app)
        if wait_ready:
            inv = app[server.INVENTORY]
            await eventually(lambda: inv.ready)
        return client

    return go


async def synced(client: TestClient[web.Request, web.Application], kind: Kind, obj: JsonObj) -> None:
    """Wait until the app's ``kind`` watch has applied the write that produced ``obj``."""
    state = client.app[server.WATCHES][kind]
    want = int(obj["metadata"]["resourceVersion"])
    await eventually(lambda: state.listed and int(state.resource_version or 0) >= want)
