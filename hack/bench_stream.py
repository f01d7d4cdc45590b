#!/usr/bin/env python3
"""The training side's read path, measured: CPU per record and records/s draining a live stream
through :class:`flexlease.streaming.source.TrainingSource` (pull reader one batch ahead, a step
that parses every record's number, a committed offset per batch), on a real ``nats-server -js``.

For 1 and ``--per-message`` records per message it pre-fills the stream with ``--records``
numbered records (``Nats-Msg-Id`` set, as the producer of hack/stream_restarts.py does), then
drains it twice in this process: with the reader as shipped (the stream sequence taken from
the reply subject, :func:`flexlease.streaming.jetstream.stream_sequence`) and with a baseline
reader that asks nats-py for ``Msg.metadata`` (which also builds a datetime per message).
Prints CPU µs per record (this process only; nats-server runs beside it), wall records/s and
the ratio shipped / baseline. ::

    python hack/bench_stream.py [--records 200000] [--per-message 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from flexlease.streaming.broker import Record
from flexlease.streaming.config import StreamBinding
from flexlease.streaming.jetstream import JetStreamBroker, JetStreamReader, ensure_live_stream, publish
from flexlease.streaming.source import TrainingSource
from hack.stream_restarts import start_nats


class MetadataReader(JetStreamReader):
    """The baseline: the stream sequence from nats-py's parsed ``Msg.metadata``."""

    async def _on_msg(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get("Status"):
            self._outstanding = 0
            self._arrived.set()
            return
        self._buf.append(Record(seq=msg.metadata.sequence.stream, data=msg.data))
        self._outstanding -= 1
        self._arrived.set()


async def fill(broker: JetStreamBroker, stream: str, records: int, per_message: int) -> None:
    await ensure_live_stream(broker, stream, subjects=[f"{stream}.in"], max_msgs=records + 1)
    pad = b"x" * 64
    for first in range(1, records + 1, per_message):
        last = min(records, first + per_message - 1)
        await publish(
            broker, f"{stream}.in", first, b"".join(b"%d|%s\n" % (k, pad) for k in range(first, last + 1))
        )
        if first % 5000 < per_message:
            await broker.nc.flush()
    await broker.nc.flush()
    want = -(-records // per_message)
    for _ in range(1200):  # the server stored them all (at most a minute)
        if (await broker.stream_state(stream)).last_seq >= want:
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"{stream}: the server stored fewer than {want} messages")


async def drain(broker: JetStreamBroker, stream: str, durable: str, records: int) -> tuple[float, float]:
    """Read every record once; returns (CPU seconds, wall seconds)."""
    source = TrainingSource(broker, StreamBinding(stream, f"{stream}.in", durable), batch_size=1000)
    taken, expect = 0, 1
    cpu, wall = time.process_time(), time.perf_counter()
    async with aclosing(source.batches()) as batches:
        async for b in batches:
            for r in b.records:  # the step: every record's number, in order
                for line in r.data.splitlines():
                    n = int(line.split(b"|", 1)[0])
                    assert n == expect
                    expect += 1
                    taken += 1
            await source.commit(b)
            if taken >= records:
                break
    return time.process_time() - cpu, time.perf_counter() - wall


async def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="flexlease-bench-stream-"))
    nats, url = start_nats(work)
    load = os.getloadavg()[0]
    try:
        async with JetStreamBroker(url) as broker:
            rows = []
            for per in sorted({1, args.per_message}):
                stream = f"B{per}"
                await fill(broker, stream, args.records, per)
                results = {}
                for name, cls in (("shipped", JetStreamReader), ("baseline", MetadataReader)):
                    broker.reader_class = cls
                    results[name] = await drain(broker, stream, f"{name}-{per}", args.records)
                rows.append((per, results))
    finally:
        nats.terminate()
        nats.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.records:,} records, batches of 1000; {platform.machine()}, {os.cpu_count()} cores,"
        f" load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("| records/message | reader | CPU µs/record | records/s (wall) | CPU ratio shipped/baseline |")
    print("|---:|---|---:|---:|---:|")
    for per, results in rows:
        base_cpu = results["baseline"][0]
        for name in ("shipped", "baseline"):
            cpu, wall = results[name]
            ratio = f"{cpu / base_cpu:.2f}" if name == "shipped" else ""
            print(
                f"| {per} | {name} | {cpu / args.records * 1e6:.2f} | {args.records / wall:,.0f} | {ratio} |"
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="hack/bench_stream.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--per-message", type=int, default=10)
    asyncio.run(bench(p.parse_args(argv)))


if __name__ == "__main__":
    main()
