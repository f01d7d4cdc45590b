"""The training side of streaming-data staging (WeFlex §3.3): a source a job's input
pipeline iterates, committing offsets only after the step that consumed them.

::

    async with JetStreamBroker(url) as broker:
        source = TrainingSource(broker, binding)
        async with contextlib.aclosing(source.batches()) as batches:
            async for batch in batches:
                train_step(batch.records)    # the job's work (and its checkpoint)
                await source.commit(batch)   # only now is the batch consumed

Every record is yielded in stream-sequence order, each once in a committed batch: a restarted
trainer resumes at its committed offset + 1 (a batch yielded but not committed before a crash
is yielded again — its step must not have been kept; checkpoint the model with the offset,
``start_after``). The next record is read from wherever it still is: the job's staging stream
(``FLEXLEASE_STAGE_<durable>``, filled by the node agent during a restart) when the live
stream no longer holds it, else the live stream. Staging is drained in order; once the next
record is in the live stream again the source switches to it and commits with
``origin=live``, which tells the agent that the job has caught up. When neither stream holds
the next record (a restart outlasted W_stage or the live buffer), the source does not hide
it: it records a :class:`Gap` (where the data resumes and how many records were lost),
calls ``on_gap`` and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from flexlease import errors
from flexlease.logging import ctx
from flexlease.streaming.broker import Broker, Origin, Reader, Record, StreamState
from flexlease.streaming.cancel import raise_if_cancelling
from flexlease.streaming.config import StreamBinding

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    """Records read together, in sequence order, from one ``origin``; ``last_seq`` is the
    offset :meth:`TrainingSource.commit` stores."""

    records: tuple[Record, ...]
    origin: Origin

    @property
    def last_seq(self) -> int:
        return self.records[-1].seq


@dataclass(frozen=True, slots=True)
class Gap:
    """Records ``expected``..``resume - 1`` were in neither stream: ``lost`` of them."""

    expected: int
    resume: int

    @property
    def lost(self) -> int:
        return self.resume - self.expected


@dataclass
class _Position:
    next_seq: int
    revision: int | None
    gaps: list[Gap] = field(default_factory=list)


class TrainingSource:
    """Yields the job's records as :class:`Batch` es (see the module docstring).

    ``batch_size`` records at most per batch; ``poll_seconds`` how long a fetch waits for new
    records; ``start_after`` the offset of the job's own checkpoint (default: the committed
    offset, or the live stream's first record for a new job); ``on_gap`` is called with
    each :class:`Gap`. Raises ``StreamNotFound`` when the live stream does not exist,
    ``OffsetConflict`` on commit when another instance committed meanwhile.
    """

    def __init__(
        self,
        broker: Broker,
        binding: StreamBinding,
        *,
        batch_size: int = 500,
        poll_seconds: float = 0.2,
        start_after: int | None = None,
        on_gap: Callable[[Gap], None] | None = None,
    ) -> None:
        self._broker = broker
        self.binding = binding
        self._batch_size = batch_size
        self._poll = poll_seconds
        self._start_after = start_after
        self._on_gap = on_gap
        self._pos: _Position | None = None
        self.origin: Origin | None = None

    @property
    def gaps(self) -> list[Gap]:
        return list(self._pos.gaps) if self._pos else []

    @property
    def next_seq(self) -> int | None:
        """The sequence of the next record to yield (None before the first batch)."""
        return self._pos.next_seq if self._pos else None

    async def _start(self) -> _Position:
        live = await self._broker.stream_state(self.binding.stream)
        if live.subjects and self.binding.subject not in live.subjects:
            raise errors.PodSpecError(
                f"streaming configuration: subject {self.binding.subject!r} is not captured by stream "
                f"{self.binding.stream!r} (subjects {list(live.subjects)})"
            )
        commit = await self._broker.committed(self.binding.durable)
        revision = commit.revision if commit else None
        if self._start_after is not None:
            return _Position(self._start_after + 1, revision)
        if commit is not None:
            return _Position(commit.seq + 1, revision)
        return _Position(live.first_seq if live.messages else live.last_seq + 1, revision)

    async def _staging_state(self) -> StreamState | None:
        try:
            return await self._broker.stream_state(self.binding.staging_stream)
        except errors.StreamNotFound:
            return None

    async def _choose(self, pos: _Position) -> Origin:
        """Where the next record is; records a gap (and moves on) when it is nowhere."""
        live = await self._broker.stream_state(self.binding.stream)
        if live.holds(pos.next_seq):
            return Origin.LIVE
        staging = await self._staging_state()
        if staging is not None and staging.holds(pos.next_seq):
            return Origin.STAGING
        if pos.next_seq > live.last_seq:
            return Origin.LIVE
        candidates = [
            s.first_seq
            for s in (staging, live)
            if s is not None and s.messages and s.last_seq >= pos.next_seq
        ]
        resume = min(candidates) if candidates else live.last_seq + 1
        self._gap(pos, resume)
        return Origin.STAGING if staging is not None and staging.holds(resume) else Origin.LIVE

    def _gap(self, pos: _Position, resume: int) -> None:
        gap = Gap(expected=pos.next_seq, resume=resume)
        pos.gaps.append(gap)
        pos.next_seq = resume
        log.warning(
            "records lost before the job read them; resuming",
            extra=ctx(durable=self.binding.durable, expected=gap.expected, resume=resume, lost=gap.lost),
        )
        if self._on_gap is not None:
            self._on_gap(gap)

    async def batches(self) -> AsyncGenerator[Batch, None]:
        """Batches forever (until the caller stops iterating). Raises ``BrokerError``."""
        if self._pos is None:
            self._pos = await self._start()
        pos = self._pos
        while True:
            origin = await self._choose(pos)
            stream = self.binding.staging_stream if origin is Origin.STAGING else self.binding.stream
            self.origin = origin
            reader: Reader = await self._broker.open_reader(stream, start_seq=pos.next_seq)
            try:
                raise_if_cancelling()  # the broker client may have swallowed it (flexlease.streaming.cancel)
                async for batch in self._read(reader, origin, pos):
                    yield batch
            finally:
                await reader.close()

    async def _read(self, reader: Reader, origin: Origin, pos: _Position) -> AsyncGenerator[Batch, None]:
        """Batches from one stream while it yields the next records in order; returns to
        let :meth:`batches` choose again (staging drained, or a jump in sequence)."""
        while True:
            records = await reader.fetch(self._batch_size, wait_seconds=self._poll)
            raise_if_cancelling()
            if not records:
                if origin is Origin.STAGING:
                    return  # drained what is staged: the next record may be live by now
                continue
            taken: list[Record] = []
            for r in records:
                if r.seq < pos.next_seq:
                    continue
                if r.seq > pos.next_seq:
                    break
                taken.append(r)
                pos.next_seq = r.seq + 1
            if taken:
                yield Batch(tuple(taken), origin)
                if origin is Origin.STAGING and (await self._broker.stream_state(self.binding.stream)).holds(
                    pos.next_seq
                ):
                    return  # the live stream holds the next record again: switch to it
            if len(taken) < len(records) and records[-1].seq >= pos.next_seq:
                return  # a jump: the next record was dropped here; look for it elsewhere

    async def commit(self, batch: Batch) -> None:
        """Store ``batch.last_seq`` as the job's offset: call once the step that consumed
        the batch is done. Raises ``OffsetConflict`` or ``BrokerError``."""
        if self._pos is None:
            raise errors.RequestError("commit before the first batch")
        self._pos.revision = await self._broker.commit(
            self.binding.durable, batch.last_seq, origin=batch.origin, revision=self._pos.revision
        )
