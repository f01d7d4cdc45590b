"""The message-broker interface streaming-data staging needs (WeFlex §3.3), and its values.

Only the verbs flexlease uses: a stream's state, a staging stream that copies a live stream
from a sequence on (keeping the live stream's sequence numbers, so one offset names a record
in both), readers positioned at a sequence, and a committed offset per durable name with
compare-and-set. :class:`~flexlease.streaming.jetstream.JetStreamBroker` implements it on
NATS JetStream; another backend (Pulsar, Kafka) implements this Protocol and nothing else
changes. All errors are :class:`flexlease.errors.BrokerError` (``StreamNotFound``,
``OffsetConflict``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StreamState:
    """A stream's retained range: sequences ``first_seq``..``last_seq`` (``first_seq`` =
    ``last_seq`` + 1 when empty), ``messages`` held (fewer than the range when some in it
    were lost) and their ``bytes``; ``subjects`` the stream captures (empty for a copy)."""

    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    subjects: tuple[str, ...] = ()

    def holds(self, seq: int) -> bool:
        """Whether ``seq`` is within the retained range."""
        return self.messages > 0 and self.first_seq <= seq <= self.last_seq


@dataclass(frozen=True, slots=True)
class Record:
    """One record: its stream sequence ``seq`` (the offset) and payload ``data``."""

    seq: int
    data: bytes


class Origin(enum.StrEnum):
    """Which stream a record was read from."""

    LIVE = "live"
    STAGING = "staging"


@dataclass(frozen=True, slots=True)
class Commit:
    """A durable name's committed offset: the last record ``seq`` whose step finished, the
    ``origin`` it was read from, and the store ``revision`` for compare-and-set."""

    seq: int
    origin: Origin
    revision: int


class Reader(Protocol):
    """Records of one stream in sequence order from a start sequence."""

    async def fetch(self, max_records: int, *, wait_seconds: float) -> list[Record]:
        """Up to ``max_records`` next records; ``[]`` when none arrived within ``wait_seconds``
        seconds. Raises ``BrokerError``."""
        ...

    async def close(self) -> None: ...


class Broker(Protocol):
    """What staging and the training source need from a broker."""

    async def stream_state(self, stream: str) -> StreamState:
        """Raises ``StreamNotFound`` when there is no such stream."""
        ...

    async def stage(
        self, staging: str, *, origin: str, start_seq: int, max_msgs: int, max_bytes: int
    ) -> None:
        """Create ``staging`` as a copy of ``origin`` from ``start_seq`` on, keeping origin's
        sequence numbers and holding at most ``max_msgs`` records / ``max_bytes`` bytes (the
        oldest are dropped beyond that). When it exists, only its limits are updated.
        Raises ``StreamNotFound`` when ``origin`` does not exist."""
        ...

    async def drop(self, stream: str) -> bool:
        """Delete a stream; ``False`` when it did not exist."""
        ...

    async def open_reader(self, stream: str, *, start_seq: int) -> Reader:
        """A reader of ``stream`` from ``start_seq``. Raises ``StreamNotFound``."""
        ...

    async def committed(self, durable: str) -> Commit | None:
        """The durable name's committed offset, ``None`` before its first commit."""
        ...

    async def commit(self, durable: str, seq: int, *, origin: Origin, revision: int | None) -> int:
        """Commit ``seq`` if the stored revision is still ``revision`` (``None``: no commit
        yet); returns the new revision. Raises ``OffsetConflict`` otherwise."""
        ...
