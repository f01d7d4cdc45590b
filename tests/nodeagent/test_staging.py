"""The agent's Stager against a real nats-server and a MemoryStore: sizing from W_stage,
overflow reported (metric, Event, resume annotation), catch-up ending staging, bad
configuration answered with a StagingFailed Event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from flexlease.streaming.broker import Origin
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream, publish
from flexlease.streaming.source import TrainingSource
from nodeagent.staging import STAGING_CATCHUP, STAGING_LOST, STAGING_OVERFLOWS, Stager, StagingMetrics
from tests.natsserver import NatsServer

NODE = "gpu-1"
STREAM_ANN = {
    keys.ANN_STREAM: "LIVE",
    keys.ANN_STREAM_SUBJECT: "live.job",
    keys.ANN_STREAM_DURABLE: "job-1",
    keys.ANN_STAGING_MARGIN: "0",
}
BINDING = StreamBinding("LIVE", "live.job", "job-1", 0.0)


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": "ml", "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "trainer", "image": "trainer:v1"}]},
    }


@pytest.fixture
async def env(
    nats_server: NatsServer,
) -> AsyncIterator[tuple[JetStreamBroker, MemoryStore, Stager, CollectorRegistry]]:
    store = MemoryStore()
    registry = CollectorRegistry()
    async with JetStreamBroker(nats_server.url, timeout=2) as broker:
        await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
        stager = Stager(
            broker,
            store,
            StagingMetrics(registry, node=NODE),
            node=NODE,
            rate_sample_seconds=0.2,
            poll_seconds=0.05,
        )
        task = asyncio.create_task(stager.run(), name="stager")
        try:
            yield broker, store, stager, registry
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()


async def produce(broker: JetStreamBroker, first: int, last: int, *, follow: str | None = None) -> None:
    for start in range(first, last + 1, 50):
        end = min(last, start + 49)
        for n in range(start, end + 1):
            await publish(broker, "live.job", n, str(n).encode())
        await broker.nc.flush()
        for stream in ("LIVE", follow):
            if stream is None:
                continue
            for _ in range(500):
                if (await broker.stream_state(stream)).last_seq >= end:
                    break
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.005)


async def events(store: MemoryStore) -> list[dict[str, Any]]:
    return (await store.list(Kind.EVENT, namespace="ml")).items


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name, {"node": NODE}) or 0.0


async def test_a_pod_without_binding_is_not_staged(env: Any) -> None:
    _, store, stager, _ = env
    assert await stager.begin(pod({}), window_seconds=1) is None
    assert await events(store) == []


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {keys.ANN_STREAM: "LIVE"},
            f"{keys.ANN_STREAM_SUBJECT} is missing; {keys.ANN_STREAM_DURABLE} is missing",
        ),
        ({**STREAM_ANN, keys.ANN_STREAM: "NOPE"}, "stream NOPE: no such stream"),
        (
            {**STREAM_ANN, keys.ANN_STREAM_SUBJECT: "other.job"},
            "subject 'other.job' is not captured by stream 'LIVE'",
        ),
        ({**STREAM_ANN, keys.ANN_STAGING_MARGIN: "-3"}, "must be a number of seconds >= 0"),
    ],
)
async def test_bad_configuration_is_answered_with_an_event(
    env: Any, annotations: dict[str, str], message: str
) -> None:
    _, store, stager, registry = env
    await store.create(Kind.POD, pod(annotations))
    assert await stager.begin(pod(annotations), window_seconds=1) is None
    [ev] = await events(store)
    assert ev["reason"] == "StagingFailed" and ev["type"] == "Warning"
    assert message in ev["message"], ev["message"]
    assert ev["involvedObject"]["name"] == "trainer-0"
    assert sample(registry, "flexlease_staging_failed_total") == 1


async def test_overflow_is_reported_with_where_data_resumes(env: Any) -> None:
    broker, store, stager, registry = env
    await store.create(Kind.POD, pod(STREAM_ANN))
    await produce(broker, 1, 20)
    staging = await stager.begin(pod(STREAM_ANN), window_seconds=0.1)
    assert staging is not None and staging.start_seq == 1  # no commit yet: from the first record held
    # W_stage = 0.1 s + 0 margin at the measured rate: far fewer than the 4000 records to come
    await produce(broker, 21, 4000, follow=BINDING.staging_stream)
    assert staging.limits is not None and staging.limits.window_seconds == pytest.approx(0.1)
    assert staging.limits.max_msgs < 3900
    for _ in range(200):
        if sample(registry, STAGING_OVERFLOWS + "_total") > 0:
            break
        await asyncio.sleep(0.05)
    ev = [e for e in await events(store) if e["reason"] == "StagingOverflow"]
    assert ev and "its data resumes at" in ev[0]["message"]
    stored = await store.get(Kind.POD, "trainer-0", namespace="ml")
    resume = json.loads(stored["metadata"]["annotations"][keys.ANN_STREAM_RESUME])
    assert resume["seq"] > 1 and resume["lost"] == resume["seq"] - 1
    assert sample(registry, STAGING_LOST + "_total") >= resume["lost"]
    # and the job, reading from its offset, is told the same
    source = TrainingSource(broker, BINDING, batch_size=500, start_after=0)
    async with asyncio.timeout(10), aclosing(source.batches()) as batches:
        first = await anext(batches)
    assert source.gaps[0].expected == 1 and source.gaps[0].resume >= resume["seq"]
    assert first.records[0].seq == source.gaps[0].resume


async def test_staging_ends_once_the_restarted_job_caught_up(env: Any) -> None:
    broker, store, stager, registry = env
    await store.create(Kind.POD, pod(STREAM_ANN))
    await produce(broker, 1, 10)
    first = TrainingSource(broker, BINDING, batch_size=10)
    async with aclosing(first.batches()) as batches:
        async for batch in batches:
            await first.commit(batch)
            break
    staging = await stager.begin(pod(STREAM_ANN), window_seconds=5)
    assert staging is not None and staging.start_seq == 11
    await produce(broker, 11, 1000, follow=BINDING.staging_stream)  # the trainer is down
    staging.restarted()
    got: list[int] = []
    source = TrainingSource(broker, BINDING, batch_size=100)
    async with asyncio.timeout(20), aclosing(source.batches()) as batches:
        producer = asyncio.create_task(produce(broker, 1001, 1200), name="producer")
        async for batch in batches:
            got.extend(int(r.data) for r in batch.records)
            await source.commit(batch)
            if batch.last_seq >= 1200:
                break
        await producer
        await staging.done.wait()
    assert batch.origin is Origin.LIVE
    assert got == list(range(11, got[-1] + 1))
    assert staging.catchup_seconds is not None and staging.lost == 0
    assert registry.get_sample_value(STAGING_CATCHUP + "_count", {"node": NODE}) == 1
    assert sample(registry, "flexlease_staging_active") == 0
    assert not [e for e in await events(store) if e["reason"] == "StagingOverflow"]


async def test_staging_grows_when_the_input_rate_rises_after_the_first_sample(env: Any) -> None:
    broker, store, stager, _ = env
    await store.create(Kind.POD, pod(STREAM_ANN))
    await produce(broker, 1, 10)
    staging = await stager.begin(pod(STREAM_ANN), window_seconds=1.0)
    assert staging is not None
    for _ in range(200):  # the first sample: no input at all
        if staging.limits is not None:
            break
        await asyncio.sleep(0.02)
    assert staging.limits is not None and staging.limits.max_msgs == 1000  # the floor
    await produce(broker, 11, 3000, follow=BINDING.staging_stream)  # the producer catches up
    for _ in range(200):
        if staging.limits.max_msgs > 1100:
            break
        await asyncio.sleep(0.02)
    assert staging.limits.max_msgs > 1100
    info = await broker.js.stream_info(BINDING.staging_stream)
    assert info.config.max_msgs == staging.limits.max_msgs
