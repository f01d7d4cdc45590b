"""The :class:`~flexlease.streaming.broker.Broker` on NATS JetStream (``nats-py``).

- A staging stream is a JetStream *mirror* of the live stream from ``opt_start_seq``: a
  mirror keeps the origin's sequence numbers, so a job's offset names the same record in the
  live and the staging stream, and its ``max_msgs``/``max_bytes`` limits (discard old) bound it.
- Readers are pull consumers (ack policy none; the offset is ours) that start at a sequence,
  pull one batch ahead, and are deleted on close (and expire after ``inactive_threshold``
  when a reader dies).
- Committed offsets live in the key-value bucket ``flexlease_offsets`` (file storage, so they
  survive a broker restart); :meth:`JetStreamBroker.commit` is a compare-and-set on the
  key's revision, which fences a stale trainer instance.
- Producers publish with a ``Nats-Msg-Id`` header; the live stream's ``duplicate_window``
  drops a record published twice (a retry after a broker restart), see :func:`publish`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import deque
from types import TracebackType
from typing import Final, Self

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
    StreamSource,
)
from nats.js.kv import KeyValue

from flexlease import errors
from flexlease.streaming.broker import Commit, Origin, Record, StreamState
from flexlease.streaming.cancel import raise_if_cancelling
from flexlease.streaming.config import OFFSETS_BUCKET

log = logging.getLogger(__name__)

MSG_ID_HEADER: Final = "Nats-Msg-Id"
_READER_IDLE_SECONDS: Final = 30.0
_PULL_EXPIRES_SECONDS: Final = 5.0


def stream_sequence(reply: str) -> int:
    """A JetStream message's stream sequence from its reply subject, without building
    nats-py's ``Msg.Metadata`` (which also parses the timestamp into a datetime: a third of
    a reader's CPU per record). The subject is ``$JS.ACK.<stream>.<consumer>.<delivered>.
    <stream seq>.<consumer seq>.<timestamp>.<pending>`` (9 tokens) or, from servers that add
    the domain and account hash, ``$JS.ACK.<domain>.<account>.<stream>...`` (11–12 tokens;
    ADR-15). Raises ``BrokerError`` for a subject of neither form."""
    tokens = reply.split(".")
    if tokens[:2] == ["$JS", "ACK"]:
        if len(tokens) == 9:
            return int(tokens[5])
        if len(tokens) in (11, 12):
            return int(tokens[7])
    raise errors.BrokerError(f"not a JetStream message reply subject: {reply!r}")


def _wrap(what: str, exc: Exception) -> errors.BrokerError:
    if isinstance(exc, nats.js.errors.NotFoundError):
        return errors.StreamNotFound(f"{what}: no such stream ({exc.description})")
    return errors.BrokerError(f"{what}: {type(exc).__name__}: {exc}")


class JetStreamReader:
    """A pull consumer from a start sequence (ack policy none: the offset is ours). It asks
    for ``batch`` records at a time on its own inbox and asks again once they arrived, so at
    most one batch is in flight and buffered (the server waits for the next request:
    back-pressure), while the next batch travels as the caller works on the last one.
    nats-py's ``fetch`` would return with whatever came with the first message, one
    request round trip per handful of records."""

    def __init__(self, nc: Client, js: JetStreamContext, stream: str, name: str, *, batch: int) -> None:
        self._nc = nc
        self._js = js
        self._stream = stream
        self._name = name
        self._batch = batch
        self._inbox = nc.new_inbox()
        self._buf: deque[Record] = deque()
        self._arrived = asyncio.Event()
        self._outstanding = 0
        self._sub: Subscription | None = None

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)
        await self._request()

    async def _request(self) -> None:
        body = json.dumps({"batch": self._batch, "expires": int(_PULL_EXPIRES_SECONDS * 1e9)}).encode()
        self._outstanding = self._batch
        await self._nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._name}", body, reply=self._inbox
        )

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        if headers and "Status" in headers:  # 404/408: the request ended
            self._outstanding = 0
            self._arrived.set()
            return
        self._buf.append(Record(stream_sequence(msg.reply), msg.data))
        self._outstanding -= 1
        self._arrived.set()

    async def fetch(self, max_records: int, *, wait_seconds: float) -> list[Record]:
        try:
            if self._outstanding <= 0:
                await self._request()
                raise_if_cancelling()  # a cancel during the request's flush was swallowed
            if not self._buf:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), wait_seconds)
                except TimeoutError:
                    return []
            out = [self._buf.popleft() for _ in range(min(max_records, len(self._buf)))]
            if self._outstanding <= 0 and not self._buf:
                await self._request()
                raise_if_cancelling()
        except (nats.errors.Error, OSError) as exc:
            raise _wrap(f"fetch from {self._stream}", exc) from exc
        return out

    async def close(self) -> None:
        try:
            if self._sub is not None:
                await self._sub.unsubscribe()
            await self._js.delete_consumer(self._stream, self._name)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            log.debug("reader close", extra={"stream": self._stream, "error": str(exc)})


class JetStreamBroker:
    """A connection to a NATS server with JetStream. Use as ``async with
    JetStreamBroker(url)``; ``url`` like ``nats://127.0.0.1:4222``. The client reconnects
    on its own after a broker restart; calls in between raise ``BrokerError``."""

    reader_class: type[JetStreamReader] = JetStreamReader
    """What :meth:`open_reader` makes (hack/bench_stream.py measures a baseline subclass)."""

    def __init__(self, url: str, *, timeout: float = 5.0, reconnect_seconds: float = 0.25) -> None:
        self.url = url
        self._timeout = timeout
        self._reconnect = reconnect_seconds
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect. Raises ``BrokerError`` when the server cannot be reached."""
        try:
            self._nc = await nats.connect(
                self.url,
                connect_timeout=self._timeout,
                reconnect_time_wait=self._reconnect,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
            )
        except (OSError, nats.errors.Error) as exc:
            raise errors.BrokerError(f"cannot connect to {self.url}: {exc}") from exc
        self._js = self._nc.jetstream(timeout=self._timeout)

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise errors.BrokerError("not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise errors.BrokerError("not connected")
        return self._js

    async def stream_state(self, stream: str) -> StreamState:
        try:
            info = await self.js.stream_info(stream)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"stream {stream}", exc) from exc
        s = info.state
        return StreamState(
            first_seq=s.first_seq,
            last_seq=s.last_seq,
            messages=s.messages,
            bytes=s.bytes,
            subjects=tuple(info.config.subjects or ()),
        )

    async def stage(
        self, staging: str, *, origin: str, start_seq: int, max_msgs: int, max_bytes: int
    ) -> None:
        config = StreamConfig(
            name=staging,
            mirror=StreamSource(name=origin, opt_start_seq=max(1, start_seq)),
            max_msgs=max_msgs,
            max_bytes=max_bytes,
            discard=DiscardPolicy.OLD,
            storage=StorageType.FILE,
        )
        try:
            await self.js.stream_info(origin)
            try:
                current = await self.js.stream_info(staging)
            except nats.js.errors.NotFoundError:
                await self.js.add_stream(config)
                return
            await self.js.update_stream(
                StreamConfig.from_response(
                    {**current.config.as_dict(), "max_msgs": max_msgs, "max_bytes": max_bytes}
                )
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"staging stream {staging} of {origin}", exc) from exc

    async def drop(self, stream: str) -> bool:
        try:
            return await self.js.delete_stream(stream)
        except nats.js.errors.NotFoundError:
            return False
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"delete {stream}", exc) from exc

    async def open_reader(self, stream: str, *, start_seq: int, batch: int = 1000) -> JetStreamReader:
        name = f"flexlease-reader-{secrets.token_hex(6)}"
        config = ConsumerConfig(
            durable_name=name,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, start_seq),
            ack_policy=AckPolicy.NONE,
            inactive_threshold=_READER_IDLE_SECONDS,
            mem_storage=True,
        )
        reader = self.reader_class(self.nc, self.js, stream, name, batch=batch)
        try:
            await self.js.add_consumer(stream, config)
            await reader.open()
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"reader of {stream}", exc) from exc
        return reader

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.create_key_value(
                    KeyValueConfig(bucket=OFFSETS_BUCKET, history=1, storage=StorageType.FILE)
                )
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                raise _wrap(f"offsets bucket {OFFSETS_BUCKET}", exc) from exc
        return self._kv

    async def committed(self, durable: str) -> Commit | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(durable)
        except nats.js.errors.KeyNotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"offset of {durable}", exc) from exc
        body = json.loads(entry.value or b"{}")
        return Commit(seq=int(body["seq"]), origin=Origin(body["origin"]), revision=int(entry.revision or 0))

    async def commit(self, durable: str, seq: int, *, origin: Origin, revision: int | None) -> int:
        kv = await self._bucket()
        value = json.dumps({"seq": seq, "origin": origin.value}).encode()
        try:
            if revision is None:
                return await kv.create(durable, value)
            return await kv.update(durable, value, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError) as exc:
            raise errors.OffsetConflict(
                f"offset of {durable} changed since revision {revision}: another reader committed"
            ) from exc
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise _wrap(f"commit {durable}={seq}", exc) from exc


async def ensure_live_stream(
    broker: JetStreamBroker,
    stream: str,
    *,
    subjects: list[str],
    max_msgs: int,
    duplicate_window: float = 120.0,
) -> None:
    """Create (or resize) a live stream: a bounded buffer of ``max_msgs`` records (discard
    old, as the input queue of WeFlex Fig. 4) with message-id de-duplication over
    ``duplicate_window`` seconds."""
    config = StreamConfig(
        name=stream,
        subjects=subjects,
        max_msgs=max_msgs,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        duplicate_window=duplicate_window,
    )
    try:
        try:
            await broker.js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            await broker.js.add_stream(config)
            return
        await broker.js.update_stream(config)
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        raise _wrap(f"live stream {stream}", exc) from exc


async def publish(broker: JetStreamBroker, subject: str, number: int, data: bytes) -> None:
    """Publish one record without waiting for the stream's ack, with ``Nats-Msg-Id`` =
    ``number`` so that a retried publish is stored once."""
    try:
        await broker.nc.publish(subject, data, headers={MSG_ID_HEADER: str(number)})
    except (nats.errors.Error, OSError) as exc:
        raise errors.BrokerError(f"publish to {subject}: {exc}") from exc


async def publish_acked(broker: JetStreamBroker, subject: str, number: int, data: bytes) -> int:
    """Publish one record and wait for the stream's ack; returns its stream sequence (that
    of the first copy for a duplicate). Raises ``BrokerError`` (retry with the same
    ``number``: de-duplication keeps one copy)."""
    try:
        ack = await broker.js.publish(subject, data, headers={MSG_ID_HEADER: str(number)})
    except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
        raise errors.BrokerError(f"publish to {subject}: {exc}") from exc
    return ack.seq
