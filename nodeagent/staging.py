"""The node agent's side of streaming-data staging (WeFlex §3.3, "Short-Duration
Streaming-Data Staging"): while a job restarts, its live input is copied into a per-job
staging stream, so that records the live buffer drops before the restarted trainer reads
them are still there.

:meth:`Stager.begin` is called when the agent starts a hot restart of a pod whose
annotations bind it to a stream (:func:`flexlease.streaming.config.parse_binding`). It
creates ``FLEXLEASE_STAGE_<durable>``, a copy of the live stream from the job's committed
offset + 1 on, and hands a watch to :meth:`Stager.run`, which

1. measures the job's input rate (records/s and bytes/s over ``rate_sample_seconds``) and
   sizes the staging stream to W_stage = W (formulas 1–3, given by the caller) + the pod's
   margin (:func:`flexlease.streaming.config.staging_limits`); until the restart is over it
   keeps measuring (the average since the first sample) and grows the limits when the rate
   rose, never shrinks them;
2. checks every ``poll_seconds`` whether the job's next record (committed offset + 1) is
   still in the live or the staging stream. When it is in neither (the restart outlasted
   W_stage), the overflow is reported, never silent: ``flexlease_staging_overflows_total``
   and ``flexlease_staging_lost_records_total`` (alert ``FlexleaseStagingOverflow``), a
   Warning Event ``StagingOverflow`` on the pod, and the annotation
   ``flexlease.io/stream-resume`` = ``{"seq", "lost", "at"}``: where the job's data resumes;
3. ends staging once the restarted trainer has read everything staged during the restart
   and commits from the live stream again (catch-up time in
   ``flexlease_staging_catchup_seconds``), or after ``max_hold_seconds``.

A pod with a bad binding (missing field, unknown stream, subject not in the stream) gets a
Warning Event ``StagingFailed`` with the reason; its restart goes on unstaged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flexlease import errors
from flexlease.api import keys
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.kube_util import EventRecorder
from flexlease.streaming.broker import Broker, Origin, StreamState
from flexlease.streaming.cancel import raise_if_cancelling
from flexlease.streaming.config import StagingLimits, StreamBinding, parse_binding, staging_limits

log = logging.getLogger(__name__)

COMPONENT: Final = "flexlease-agent"
STAGING_ACTIVE: Final = "flexlease_staging_active"
STAGING_STARTED: Final = "flexlease_staging_started"
STAGING_OVERFLOWS: Final = "flexlease_staging_overflows"
STAGING_LOST: Final = "flexlease_staging_lost_records"
STAGING_FAILED: Final = "flexlease_staging_failed"
STAGING_CATCHUP: Final = "flexlease_staging_catchup_seconds"
STAGING_WINDOW: Final = "flexlease_staging_window_seconds"
REASON_OVERFLOW: Final = "StagingOverflow"
REASON_FAILED: Final = "StagingFailed"
_PROVISIONAL_BYTES: Final = 1 << 30
"""A staging stream's byte limit until the input rate is measured (1 GiB)."""


class StagingMetrics:
    """Staging counters and gauges (prefix ``flexlease_``, label ``node``)."""

    def __init__(self, registry: CollectorRegistry, *, node: str) -> None:
        self.node = node
        self.active = Gauge(
            STAGING_ACTIVE, "Staging streams held for restarting jobs.", ["node"], registry=registry
        )
        self.started = Counter(STAGING_STARTED, "Staging streams started.", ["node"], registry=registry)
        self.overflows = Counter(
            STAGING_OVERFLOWS,
            "Restarts whose staging overflowed (records dropped before the job read them).",
            ["node"],
            registry=registry,
        )
        self.lost = Counter(
            STAGING_LOST,
            "Records dropped before the job read them (staging overflow).",
            ["node"],
            registry=registry,
        )
        self.failed = Counter(
            STAGING_FAILED,
            "Restarts that could not be staged (bad binding, broker error).",
            ["node"],
            registry=registry,
        )
        self.catchup = Histogram(
            STAGING_CATCHUP,
            "Seconds from a restart's end until the job read all staged records and was back on live input.",
            ["node"],
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.window = Gauge(
            STAGING_WINDOW, "W_stage of the latest staging, seconds.", ["node"], registry=registry
        )
        for metric in (
            self.active,
            self.started,
            self.overflows,
            self.lost,
            self.failed,
            self.catchup,
            self.window,
        ):
            metric.labels(node=node)


@dataclass
class Staging:
    """One job's staging: what was set up and what the watch has seen so far."""

    pod: str
    namespace: str
    name: str
    uid: str
    binding: StreamBinding
    start_seq: int
    window_seconds: float
    began: float
    limits: StagingLimits | None = None
    rate_since: tuple[float, int] | None = None
    """(monotonic time, live stream's last sequence) where the rate measurement began."""
    restarted_at: float | None = None
    staged_until: int | None = None
    catchup_seconds: float | None = None
    lost: int = 0
    reported_resume: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def restarted(self) -> None:
        """The restart finished: from now the job catches up on what was staged."""
        if self.restarted_at is None:
            self.restarted_at = time.monotonic()


class Stager:
    """Starts and watches staging streams for this node's restarting jobs (module docstring).

    ``rate_sample_seconds``: how long the input rate is measured; ``poll_seconds``: how
    often a staging is checked; ``max_hold_seconds``: a staging is dropped after this long
    at the latest. :meth:`run` must be running for watches to progress.
    """

    def __init__(
        self,
        broker: Broker,
        store: Store,
        metrics: StagingMetrics,
        *,
        node: str,
        rate_sample_seconds: float = 1.0,
        poll_seconds: float = 0.25,
        max_hold_seconds: float = 3600.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._broker = broker
        self._store = store
        self.metrics = metrics
        self.node = node
        self._rate_sample = rate_sample_seconds
        self._poll = poll_seconds
        self._max_hold = max_hold_seconds
        self._now = now
        self._events = EventRecorder(store, component=COMPONENT, instance=node)
        self._pending: asyncio.Queue[Staging] = asyncio.Queue()
        self.stagings: dict[str, Staging] = {}

    async def run(self) -> None:
        """Run the watches of begun stagings until cancelled."""
        async with asyncio.TaskGroup() as tg:
            while True:
                staging = await self._pending.get()
                tg.create_task(self._watch(staging), name=f"staging:{staging.pod}")

    async def begin(self, pod: JsonObj, *, window_seconds: float) -> Staging | None:
        """Start staging ``pod``'s live input for a restart expected to take
        ``window_seconds`` (W). ``None`` when the pod has no stream binding, or when it
        cannot be staged: then a ``StagingFailed`` Event says why (never raises)."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        pod_name = f"{namespace}/{name}"
        try:
            binding = parse_binding(meta.get("annotations") or {})
            if binding is None:
                return None
            live = await self._broker.stream_state(binding.stream)
            if live.subjects and binding.subject not in live.subjects:
                raise errors.PodSpecError(
                    f"streaming configuration: subject {binding.subject!r} is not captured by stream "
                    f"{binding.stream!r} (subjects {list(live.subjects)})"
                )
            commit = await self._broker.committed(binding.durable)
            start = (
                commit.seq + 1
                if commit is not None
                else (live.first_seq if live.messages else live.last_seq + 1)
            )
            await self._broker.stage(
                binding.staging_stream,
                origin=binding.stream,
                start_seq=start,
                max_msgs=-1,
                max_bytes=_PROVISIONAL_BYTES,
            )
        except errors.FlexleaseError as exc:
            self.metrics.failed.labels(node=self.node).inc()
            log.warning(
                "cannot stage the job's input", extra=ctx(pod=pod_name, node=self.node, error=str(exc))
            )
            await self._event(pod, REASON_FAILED, f"input not staged for this restart: {exc}")
            return None
        staging = Staging(
            pod=pod_name,
            namespace=namespace,
            name=name,
            uid=str(meta.get("uid") or ""),
            binding=binding,
            start_seq=start,
            window_seconds=window_seconds,
            began=time.monotonic(),
        )
        self.stagings[pod_name] = staging
        self.metrics.started.labels(node=self.node).inc()
        self.metrics.active.labels(node=self.node).inc()
        log.info(
            "staging the job's input",
            extra=ctx(pod=pod_name, node=self.node, stream=binding.staging_stream, start_seq=start),
        )
        self._pending.put_nowait(staging)
        return staging

    async def _watch(self, s: Staging) -> None:
        try:
            await self._size(s)
            while time.monotonic() - s.began < self._max_hold:
                if await self._check(s):
                    break
                raise_if_cancelling()
                await asyncio.sleep(self._poll)
            else:
                log.warning("staging held too long; dropped", extra=ctx(pod=s.pod, node=self.node))
        except errors.BrokerError as exc:
            log.warning("staging watch failed; dropped", extra=ctx(pod=s.pod, node=self.node, error=str(exc)))
        finally:
            try:
                await self._broker.drop(s.binding.staging_stream)
            except errors.BrokerError as exc:
                log.warning("cannot drop the staging stream", extra=ctx(pod=s.pod, error=str(exc)))
            self.metrics.active.labels(node=self.node).dec()
            s.done.set()

    async def _size(self, s: Staging) -> None:
        """Measure the input rate and size the staging stream to W_stage."""
        before = await self._broker.stream_state(s.binding.stream)
        s.rate_since = (time.monotonic(), before.last_seq)
        await asyncio.sleep(self._rate_sample)
        await self._resize(s, await self._broker.stream_state(s.binding.stream))

    async def _resize(self, s: Staging, live: StreamState) -> None:
        """Size the staging stream to W_stage at the input rate averaged since the measurement
        began; a limit only grows (by a tenth at least, to spare the broker updates), so a
        producer that was slow or paused while the first sample was taken, then catches up in a
        burst, does not overflow a window sized from that sample."""
        if s.rate_since is None:
            return
        t0, seq0 = s.rate_since
        elapsed = max(time.monotonic() - t0, 1e-3)
        records = max(0, live.last_seq - seq0)
        per_record = live.bytes / live.messages if live.messages else 0.0
        limits = staging_limits(
            window_seconds=s.window_seconds,
            margin_seconds=s.binding.margin_seconds,
            records_per_second=records / elapsed,
            bytes_per_second=records * per_record / elapsed,
        )
        if s.limits is not None:
            if limits.max_msgs <= s.limits.max_msgs * 1.1 and limits.max_bytes <= s.limits.max_bytes * 1.1:
                return
            limits = StagingLimits(
                window_seconds=limits.window_seconds,
                max_msgs=max(limits.max_msgs, s.limits.max_msgs),
                max_bytes=max(limits.max_bytes, s.limits.max_bytes),
            )
        await self._broker.stage(
            s.binding.staging_stream,
            origin=s.binding.stream,
            start_seq=s.start_seq,
            max_msgs=limits.max_msgs,
            max_bytes=limits.max_bytes,
        )
        log.info(
            "staging sized" if s.limits is None else "staging grown: the input rate rose",
            extra=ctx(
                pod=s.pod,
                w_stage=round(limits.window_seconds, 3),
                max_msgs=limits.max_msgs,
                max_bytes=limits.max_bytes,
                records_per_second=round(records / elapsed, 1),
            ),
        )
        s.limits = limits
        self.metrics.window.labels(node=self.node).set(limits.window_seconds)

    async def _check(self, s: Staging) -> bool:
        """One look at the job's position; True when staging is over."""
        commit = await self._broker.committed(s.binding.durable)
        needed = commit.seq + 1 if commit is not None else s.start_seq
        live = await self._broker.stream_state(s.binding.stream)
        if s.staged_until is None:  # still filling: keep up with the input rate
            await self._resize(s, live)
        staged = await self._broker.stream_state(s.binding.staging_stream)
        if s.restarted_at is not None and s.staged_until is None:
            s.staged_until = live.last_seq
        if not live.holds(needed) and not staged.holds(needed) and needed <= live.last_seq:
            await self._overflow(s, needed, live, staged)
        if (
            s.restarted_at is not None
            and s.staged_until is not None
            and commit is not None
            and commit.origin is Origin.LIVE
            and commit.seq >= s.staged_until
        ):
            s.catchup_seconds = time.monotonic() - s.restarted_at
            self.metrics.catchup.labels(node=self.node).observe(s.catchup_seconds)
            log.info(
                "job caught up; staging ended",
                extra=ctx(pod=s.pod, catchup_seconds=round(s.catchup_seconds, 3), offset=commit.seq),
            )
            return True
        return False

    async def _overflow(self, s: Staging, needed: int, live: StreamState, staged: StreamState) -> None:
        held = [x.first_seq for x in (live, staged) if x.messages and x.last_seq >= needed]
        resume = min(held) if held else live.last_seq + 1
        if resume <= s.reported_resume:
            return
        lost = resume - max(needed, s.reported_resume)
        s.reported_resume = resume
        s.lost += lost
        self.metrics.overflows.labels(node=self.node).inc()
        self.metrics.lost.labels(node=self.node).inc(lost)
        window = s.limits.window_seconds if s.limits else s.window_seconds
        message = (
            f"the restart outlasted W_stage={window:.1f}s: {lost} records of {s.binding.stream} "
            f"({needed}..{resume - 1}) were dropped before the job read them; its data resumes at {resume}"
        )
        log.warning("staging overflow", extra=ctx(pod=s.pod, node=self.node, lost=lost, resume=resume))
        at = self._now()
        await self._event(
            {"metadata": {"namespace": s.namespace, "name": s.name, "uid": s.uid}}, REASON_OVERFLOW, message
        )
        resume_note: dict[str, Any] = {"seq": resume, "lost": s.lost, "at": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        patch = {
            "metadata": {
                "annotations": {keys.ANN_STREAM_RESUME: json.dumps(resume_note, separators=(",", ":"))}
            }
        }
        try:
            await self._store.patch(Kind.POD, s.name, patch, namespace=s.namespace)
        except errors.StoreError as exc:
            log.warning("cannot annotate where the data resumes", extra=ctx(pod=s.pod, error=str(exc)))

    async def _event(self, pod: JsonObj, reason: str, message: str) -> None:
        """A Warning Event about ``pod`` (best effort: a failed write is logged)."""
        meta = pod.get("metadata") or {}
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
        }
        await self._events.record(involved, type="Warning", reason=reason, message=message)
