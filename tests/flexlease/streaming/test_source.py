"""TrainingSource against a real nats-server: order, exactly-once across a crash mid-drain,
the switch from staging to live, a broker restart while staging, reported gaps and bad
configuration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from flexlease import errors
from flexlease.streaming.broker import Origin
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, ensure_live_stream, publish, publish_acked
from flexlease.streaming.source import Batch, Gap, TrainingSource
from tests.natsserver import NatsServer

BINDING = StreamBinding(stream="LIVE", subject="live.job", durable="job-1")


@pytest.fixture
async def broker(nats_server: NatsServer) -> AsyncIterator[JetStreamBroker]:
    async with JetStreamBroker(nats_server.url, timeout=2) as b:
        yield b


async def produce(broker: JetStreamBroker, first: int, last: int, *, follow: str | None = None) -> None:
    """Publish records ``first``..``last`` (payload: the number) at a steady pace: chunks of
    100, each stored (and, with ``follow``, copied into that staging stream) before the next."""
    for start in range(first, last + 1, 100):
        end = min(last, start + 99)
        for n in range(start, end + 1):
            await publish(broker, BINDING.subject, n, str(n).encode())
        await broker.nc.flush()
        for stream in (BINDING.stream, follow):
            if stream is not None:
                await caught_up(broker, stream, end)


async def caught_up(broker: JetStreamBroker, stream: str, seq: int) -> None:
    for _ in range(500):
        if (await broker.stream_state(stream)).last_seq >= seq:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{stream} did not reach {seq}")


async def consume(source: TrainingSource, until: int, *, commit: bool = True) -> list[Batch]:
    """Batches until record ``until`` has been read; committing each after its 'step'."""
    out: list[Batch] = []
    async with asyncio.timeout(20), aclosing(source.batches()) as batches:
        async for batch in batches:
            out.append(batch)
            if commit:
                await source.commit(batch)
            if batch.last_seq >= until:
                break
    return out


def numbers(batches: list[Batch]) -> list[int]:
    return [int(r.data) for b in batches for r in b.records]


async def test_records_in_order_and_committed_offset_resumes(broker: JetStreamBroker) -> None:
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=10_000)
    await produce(broker, 1, 1200)
    first = await consume(TrainingSource(broker, BINDING, batch_size=100), 700)
    assert numbers(first) == list(range(1, first[-1].last_seq + 1))
    assert (await broker.committed("job-1")).seq == first[-1].last_seq  # type: ignore[union-attr]
    again = await consume(TrainingSource(broker, BINDING, batch_size=100), 1200)
    assert numbers(first) + numbers(again) == list(range(1, 1201))


async def test_drains_staging_in_order_then_switches_to_live(broker: JetStreamBroker) -> None:
    # a live buffer of 300 records; the trainer committed 100, then went away
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=300)
    await produce(broker, 1, 100)
    await consume(TrainingSource(broker, BINDING, batch_size=50), 100)
    await broker.stage(BINDING.staging_stream, origin="LIVE", start_seq=101, max_msgs=5000, max_bytes=1 << 20)
    await produce(broker, 101, 2000, follow=BINDING.staging_stream)  # far more than the live buffer holds
    assert (await broker.stream_state("LIVE")).first_seq > 101
    source = TrainingSource(broker, BINDING, batch_size=200)
    got = await consume(source, 2000)
    assert numbers(got) == list(range(101, 2001))
    assert got[0].origin is Origin.STAGING
    await produce(broker, 2001, 2100)
    more = await consume(source, 2100)
    assert numbers(more) == list(range(2001, 2101))
    assert more[-1].origin is Origin.LIVE
    assert (await broker.committed("job-1")).origin is Origin.LIVE  # type: ignore[union-attr]
    assert source.gaps == []


async def test_exactly_once_across_a_crash_mid_drain(broker: JetStreamBroker) -> None:
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=200)
    await broker.stage(BINDING.staging_stream, origin="LIVE", start_seq=1, max_msgs=5000, max_bytes=1 << 20)
    await produce(broker, 1, 3000, follow=BINDING.staging_stream)
    kept: list[int] = []  # records of committed steps: the job's state
    crashed = TrainingSource(broker, BINDING, batch_size=100, start_after=0)
    n = 0
    async with aclosing(crashed.batches()) as batches:
        async for batch in batches:
            n += 1
            if n == 7:  # the trainer dies during this step: neither its state nor offset is kept
                break
            kept.extend(int(r.data) for r in batch.records)
            await crashed.commit(batch)
    assert crashed.origin is Origin.STAGING
    restarted = TrainingSource(broker, BINDING, batch_size=100)
    async with asyncio.timeout(20), aclosing(restarted.batches()) as batches:
        async for batch in batches:
            kept.extend(int(r.data) for r in batch.records)
            await restarted.commit(batch)
            if batch.last_seq >= 3000:
                break
    assert kept == list(range(1, 3001))  # none lost, none twice


async def test_a_stale_instance_cannot_commit(broker: JetStreamBroker) -> None:
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=1000)
    await produce(broker, 1, 100)
    old, new = TrainingSource(broker, BINDING, batch_size=10), TrainingSource(broker, BINDING, batch_size=10)
    old_batches = await consume(old, 10)
    new_batches = await consume(new, 20)
    # the new reader resumes right after what the old one committed (batches need not end at 10)
    assert numbers(new_batches)[0] == old_batches[-1].last_seq + 1
    with pytest.raises(errors.OffsetConflict, match="another reader committed"):
        await old.commit(old_batches[-1])


async def test_broker_restart_during_staging_loses_and_repeats_nothing(
    broker: JetStreamBroker, nats_server: NatsServer
) -> None:
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=1000)
    await produce(broker, 1, 50)
    await consume(TrainingSource(broker, BINDING, batch_size=25), 50)
    await broker.stage(BINDING.staging_stream, origin="LIVE", start_seq=51, max_msgs=5000, max_bytes=1 << 20)
    await produce(broker, 51, 1500, follow=BINDING.staging_stream)
    await asyncio.to_thread(nats_server.restart)
    # the producer retries every record from 1400 on with the same message id: de-duplicated
    n = 1400
    async with asyncio.timeout(20):
        while n <= 1800:
            try:
                await publish_acked(broker, BINDING.subject, n, str(n).encode())
                n += 1
            except errors.BrokerError:
                await asyncio.sleep(0.1)
    assert (await broker.stream_state("LIVE")).first_seq == 801  # 51..800 only in staging
    assert (await broker.stream_state(BINDING.staging_stream)).first_seq == 51
    got = await consume(TrainingSource(broker, BINDING, batch_size=100), 1800)
    assert numbers(got) == list(range(51, 1801))
    assert got[0].origin is Origin.STAGING and got[-1].origin is Origin.LIVE


async def test_a_gap_is_reported_with_where_data_resumes(broker: JetStreamBroker) -> None:
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
    await produce(broker, 1, 10)
    await consume(TrainingSource(broker, BINDING, batch_size=10), 10)
    # staging too small for the restart: it keeps only the last 1000 of 1990 records
    await broker.stage(BINDING.staging_stream, origin="LIVE", start_seq=11, max_msgs=1000, max_bytes=1 << 20)
    await produce(broker, 11, 2000, follow=BINDING.staging_stream)
    seen: list[Gap] = []
    source = TrainingSource(broker, BINDING, batch_size=200, on_gap=seen.append)
    got = await consume(source, 2000)
    assert seen == [Gap(expected=11, resume=1001)] and seen[0].lost == 990
    assert numbers(got) == list(range(1001, 2001))


async def test_unknown_stream_and_uncaptured_subject_are_clear_errors(broker: JetStreamBroker) -> None:
    with pytest.raises(errors.StreamNotFound, match="NOPE"):
        await consume(TrainingSource(broker, StreamBinding("NOPE", "live.job", "d")), 1)
    await ensure_live_stream(broker, "LIVE", subjects=["live.job"], max_msgs=100)
    with pytest.raises(errors.PodSpecError, match=r"subject 'other\.job' is not captured by stream 'LIVE'"):
        await consume(TrainingSource(broker, StreamBinding("LIVE", "other.job", "d")), 1)
    with pytest.raises(errors.StreamNotFound):
        await broker.stage("FLEXLEASE_STAGE_d", origin="NOPE", start_seq=1, max_msgs=10, max_bytes=1 << 20)
