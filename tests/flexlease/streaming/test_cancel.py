"""A cancellation that nats-py swallows mid-flush still stops the reader and the training
source (flexlease.streaming.cancel)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing, suppress
from dataclasses import dataclass, field

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from flexlease.streaming.broker import Commit, Origin, Record, StreamState
from flexlease.streaming.cancel import raise_if_cancelling
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, JetStreamReader, ensure_live_stream
from flexlease.streaming.source import TrainingSource
from tests.natsserver import NatsServer

BINDING = StreamBinding(stream="LIVE", subject="live.job", durable="job-1")


async def test_a_reader_cancelled_while_nats_py_flushes_its_request_is_cancelled(
    nats_server: NatsServer,
) -> None:
    async with JetStreamBroker(nats_server.url, timeout=2) as broker:
        await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
        await broker.js.add_consumer(
            "LIVE",
            ConsumerConfig(durable_name="r", deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
        )
        # pending_size=1: every command waits for the flusher (Client._flush_pending with
        # force_flush), the await where nats-py catches CancelledError and drops it
        nc = await nats.connect(nats_server.url, pending_size=1)
        try:
            reader = JetStreamReader(nc, nc.jetstream(), "LIVE", "r", batch=10)
            task = asyncio.create_task(reader.fetch(10, wait_seconds=30.0), name="fetch")
            await asyncio.sleep(0)  # the task runs into the flush of its pull request
            task.cancel()
            await asyncio.wait({task}, timeout=10)  # without the guard: [] after 30 s
            assert task.cancelled()
        finally:
            await nc.close()


@dataclass
class SwallowingBroker:
    """A broker whose reader drops a cancellation the way nats-py does
    (``except asyncio.CancelledError: pass``) and then finds no records."""

    fetches: int = 0
    fetched: asyncio.Event = field(default_factory=asyncio.Event)
    commits: list[int] = field(default_factory=list)

    async def stream_state(self, stream: str) -> StreamState:
        return StreamState(first_seq=1, last_seq=0, messages=0, bytes=0, subjects=("live.job",))

    async def stage(
        self, staging: str, *, origin: str, start_seq: int, max_msgs: int, max_bytes: int
    ) -> None:
        raise AssertionError("not used")

    async def drop(self, stream: str) -> bool:
        return False

    async def open_reader(self, stream: str, *, start_seq: int) -> SwallowingBroker:
        return self

    async def fetch(self, max_records: int, *, wait_seconds: float) -> list[Record]:
        self.fetches += 1
        if self.fetches >= 2:
            self.fetched.set()
        with suppress(asyncio.CancelledError):  # nats-py's Client._flush_pending
            await asyncio.sleep(wait_seconds)
        return []

    async def close(self) -> None:
        return None

    async def committed(self, durable: str) -> Commit | None:
        return None

    async def commit(self, durable: str, seq: int, *, origin: Origin, revision: int | None) -> int:
        self.commits.append(seq)
        return 1


async def test_the_source_stops_when_its_reader_swallowed_the_cancel() -> None:
    broker = SwallowingBroker()
    source = TrainingSource(broker, BINDING, poll_seconds=0.01)

    async def consume() -> None:
        async with aclosing(source.batches()) as batches:
            async for _ in batches:
                raise AssertionError("no records")

    task = asyncio.create_task(consume(), name="consume")
    await asyncio.wait_for(broker.fetched.wait(), 10)
    task.cancel()
    await asyncio.wait({task}, timeout=10)  # without the guard it polls on forever
    assert task.cancelled()


async def test_raise_if_cancelling_outside_a_cancel_does_nothing() -> None:
    raise_if_cancelling()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
