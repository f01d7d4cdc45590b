"""The availability ledger (DESIGN §4): per GPU, intervals of healthy, unhealthy and unknown
time, the availability ratio over a rolling window and the reliability tier (WeFlex §3.5).

Two halves:

* **Math** (pure, no I/O): :class:`DeviceLedger` values and the functions on them —
  :func:`record` (a health transition), :func:`advance` (time passes), :func:`resume` (the
  agent restarted: the gap since the last write is ``unknown``), :func:`availability` (the
  ratio over the window), :func:`retier` (the tier changes only at refresh, except that a
  worse ratio downgrades at once; it never upgrades between refreshes) and :func:`prune`
  (intervals wholly older than the window are folded into lifetime totals, bounding size).
* **File** (:class:`LedgerFile`): one JSON file per node under ``AgentSettings.state_dir``,
  written through :mod:`flexlease.atomicfile` (one writer at a time, a unique temp file, fsync,
  rename, fsync of the directory), so a crash at any point leaves the previous or the new
  file, whole. A file that cannot be read back is moved aside as
  ``<name>.corrupt-<UTC timestamp>`` and reported, never silently reset.

Ratio (paper §3.5): ``ratio = 1 − unhealthy / (healthy + unhealthy)`` over
``[now − window, now]``; unknown time (agent down, NVML down) is excluded from the ratio and
reported as ``unknownSeconds``. With nothing observed yet the ratio is 1.0. Times are epoch
seconds (float).
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from flexlease import atomicfile
from flexlease.api import tiers
from flexlease.api.resources import Availability, Health
from flexlease.api.tiers import Tier
from flexlease.logging import ctx

log = logging.getLogger(__name__)

FORMAT_VERSION: Final = 1


class Span(enum.StrEnum):
    """What a stretch of a GPU's time was."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, health: Health) -> Span:
        """The span a device health maps to."""
        return {Health.HEALTHY: cls.HEALTHY, Health.UNHEALTHY: cls.UNHEALTHY}.get(health, cls.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Interval:
    """``[start, end]`` seconds spent in ``state``; ``start <= end``."""

    start: float
    end: float
    state: Span


@dataclass(frozen=True, slots=True)
class Totals:
    """Seconds per span folded out of the window (lifetime, before the window)."""

    healthy: float = 0.0
    unhealthy: float = 0.0
    unknown: float = 0.0

    def add(self, state: Span, seconds: float) -> Totals:
        return replace(self, **{state.value: getattr(self, state.value) + seconds})


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """A GPU's identity as recorded in the ledger (a replaced GPU starts a new history)."""

    uuid: str
    model: str = ""
    memory_mib: int = 0
    pci_bus_id: str | None = None
    minor_number: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceLedger:
    """One GPU's history. ``intervals`` are ordered, contiguous or separated by gaps only when
    built that way by hand, never overlapping; the last one is the current state and ends at
    the last time it was seen (``advance``). ``tier`` is None until first computed."""

    identity: Identity
    intervals: tuple[Interval, ...] = ()
    folded: Totals = field(default_factory=Totals)
    tier: Tier | None = None
    tier_computed_at: float | None = None
    """When ``tier`` last changed or was confirmed at a refresh."""
    tier_refreshed_at: float | None = None
    """When the last refresh happened; the next one is due ``refresh_seconds`` later."""

    @property
    def state(self) -> Span | None:
        return self.intervals[-1].state if self.intervals else None

    @property
    def seen_until(self) -> float | None:
        return self.intervals[-1].end if self.intervals else None

    def unhealthy_until(self) -> float | None:
        """End of the last unhealthy interval, or None (seeds the hold-down after a restart)."""
        for iv in reversed(self.intervals):
            if iv.state is Span.UNHEALTHY:
                return iv.end
        return None


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Tiering parameters (``TierSettings``): ratios 0–1 and periods in seconds."""

    ha: float = tiers.DEFAULT_HA_THRESHOLD
    ma: float = tiers.DEFAULT_MA_THRESHOLD
    window_seconds: float = 14 * 86400.0
    refresh_seconds: float = 14 * 86400.0


# ---------------------------------------------------------------------------- math


def new(identity: Identity, state: Span, *, at: float) -> DeviceLedger:
    """A fresh ledger whose first interval starts at ``at`` in ``state``."""
    return DeviceLedger(identity=identity, intervals=(Interval(at, at, state),))


def advance(dev: DeviceLedger, now: float) -> DeviceLedger:
    """Extend the current interval to ``now`` (no-op when ``now`` is not later)."""
    if not dev.intervals or now <= dev.intervals[-1].end:
        return dev
    last = dev.intervals[-1]
    return replace(dev, intervals=(*dev.intervals[:-1], replace(last, end=now)))


def record(dev: DeviceLedger, state: Span, *, at: float) -> DeviceLedger:
    """``state`` from ``at`` on. A time before the current interval's end is taken as that end
    (history is never rewritten)."""
    if not dev.intervals:
        return replace(dev, intervals=(Interval(at, at, state),))
    dev = advance(dev, at)
    last = dev.intervals[-1]
    if last.state is state:
        return dev
    start = last.end
    if last.start == last.end:  # a zero-length interval carries no time: replace it
        return _coalesce(replace(dev, intervals=(*dev.intervals[:-1], Interval(start, start, state))))
    return replace(dev, intervals=(*dev.intervals, Interval(start, start, state)))


def _coalesce(dev: DeviceLedger) -> DeviceLedger:
    ivs = list(dev.intervals)
    if len(ivs) >= 2 and ivs[-2].state is ivs[-1].state:
        ivs[-2:] = [Interval(ivs[-2].start, ivs[-1].end, ivs[-1].state)]
    return replace(dev, intervals=tuple(ivs))


def resume(dev: DeviceLedger, now: float) -> DeviceLedger:
    """After an agent restart at ``now``: the time since the last write is ``unknown``."""
    if not dev.intervals or now <= dev.intervals[-1].end:
        return dev
    return advance(record(dev, Span.UNKNOWN, at=dev.intervals[-1].end), now)


def _overlap(iv: Interval, lo: float, hi: float) -> float:
    return max(0.0, min(iv.end, hi) - max(iv.start, lo))


def availability(dev: DeviceLedger, now: float, *, window_seconds: float) -> Availability:
    """Availability over ``[now − window_seconds, now]``, the current interval counted up to
    ``now``. ``ratio = 1 − unhealthy / observed`` with ``observed = healthy + unhealthy``
    (1.0 when nothing was observed); unknown time is excluded and reported."""
    lo = now - window_seconds
    sums = dict.fromkeys(Span, 0.0)
    for iv in advance(dev, now).intervals:
        sums[iv.state] += _overlap(iv, lo, now)
    observed = sums[Span.HEALTHY] + sums[Span.UNHEALTHY]
    ratio = 1.0 - sums[Span.UNHEALTHY] / observed if observed > 0 else 1.0
    return Availability(
        window_seconds=window_seconds,
        observed_seconds=observed,
        unavailable_seconds=sums[Span.UNHEALTHY],
        unknown_seconds=sums[Span.UNKNOWN],
        ratio=min(1.0, max(0.0, ratio)),
    )


def retier(dev: DeviceLedger, ratio: float, *, now: float, th: Thresholds) -> DeviceLedger:
    """The tier after looking at ``ratio`` at ``now``: recomputed when never computed or when
    ``refresh_seconds`` passed since the last refresh; otherwise only lowered, at once, when the
    ratio now classifies lower (never raised between refreshes)."""
    current = tiers.classify(ratio, th.ha, th.ma)
    due = (
        dev.tier is None or dev.tier_refreshed_at is None or now - dev.tier_refreshed_at >= th.refresh_seconds
    )
    if due:
        return replace(dev, tier=current, tier_computed_at=now, tier_refreshed_at=now)
    assert dev.tier is not None
    if current < dev.tier:
        return replace(dev, tier=current, tier_computed_at=now)
    return dev


def prune(dev: DeviceLedger, now: float, *, window_seconds: float) -> DeviceLedger:
    """Fold intervals that ended before the window (``end <= now − window``) into
    ``folded``; the current interval is always kept. Bounds the ledger to the intervals that
    touch the window."""
    lo = now - window_seconds
    keep: list[Interval] = []
    folded = dev.folded
    for i, iv in enumerate(dev.intervals):
        if iv.end <= lo and i < len(dev.intervals) - 1:
            folded = folded.add(iv.state, iv.end - iv.start)
        else:
            keep.append(iv)
    if len(keep) == len(dev.intervals):
        return dev
    return replace(dev, intervals=tuple(keep), folded=folded)


# ---------------------------------------------------------------------------- file format


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class _DeviceDoc(_Model):
    uuid: str
    model: str = ""
    memory_mib: int = Field(default=0, alias="memoryMiB", ge=0)
    pci_bus_id: str | None = Field(default=None, alias="pciBusId")
    minor_number: int | None = Field(default=None, alias="minorNumber")
    intervals: list[tuple[float, float, Span]]
    folded: dict[Span, float] = Field(default_factory=dict)
    tier: Tier | None = None
    tier_computed_at: float | None = Field(default=None, alias="tierComputedAt")
    tier_refreshed_at: float | None = Field(default=None, alias="tierRefreshedAt")

    @model_validator(mode="after")
    def _ordered(self) -> _DeviceDoc:
        prev = float("-inf")
        for start, end, _ in self.intervals:
            if not prev <= start <= end:
                raise ValueError(f"intervals out of order at [{start}, {end}]")
            prev = end
        return self


class _LedgerDoc(_Model):
    version: int
    node: str
    written_at: float = Field(alias="writtenAt")
    devices: dict[int, _DeviceDoc]

    @model_validator(mode="after")
    def _known_version(self) -> _LedgerDoc:
        if self.version != FORMAT_VERSION:
            raise ValueError(f"ledger format version {self.version} is not {FORMAT_VERSION}")
        for index, dev in self.devices.items():
            if dev.intervals and dev.intervals[-1][1] > self.written_at:
                raise ValueError(f"GPU {index}: intervals end after writtenAt")
        return self


def encode(node: str, devices: dict[int, DeviceLedger], *, written_at: float) -> bytes:
    """The file content for ``devices`` (JSON, UTF-8)."""
    doc: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "node": node,
        "writtenAt": written_at,
        "devices": {
            str(i): {
                "uuid": d.identity.uuid,
                "model": d.identity.model,
                "memoryMiB": d.identity.memory_mib,
                "pciBusId": d.identity.pci_bus_id,
                "minorNumber": d.identity.minor_number,
                "intervals": [[iv.start, iv.end, iv.state.value] for iv in d.intervals],
                "folded": {s.value: getattr(d.folded, s.value) for s in Span},
                "tier": None if d.tier is None else d.tier.value,
                "tierComputedAt": d.tier_computed_at,
                "tierRefreshedAt": d.tier_refreshed_at,
            }
            for i, d in sorted(devices.items())
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded file: the node it belongs to, when it was written, the GPUs' ledgers."""

    node: str
    written_at: float
    devices: dict[int, DeviceLedger]


def decode(data: bytes) -> Decoded:
    """Parse file content. Raises ``ValueError`` (incl. ``pydantic.ValidationError``) when it
    is not a valid ledger."""
    try:
        doc = _LedgerDoc.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(
            f"not a valid ledger: {exc.error_count()} error(s): {exc.errors()[0]['msg']}"
        ) from exc
    devices = {
        i: DeviceLedger(
            identity=Identity(
                uuid=d.uuid,
                model=d.model,
                memory_mib=d.memory_mib,
                pci_bus_id=d.pci_bus_id,
                minor_number=d.minor_number,
            ),
            intervals=tuple(Interval(s, e, st) for s, e, st in d.intervals),
            folded=Totals(**{k.value: v for k, v in d.folded.items()}),
            tier=d.tier,
            tier_computed_at=d.tier_computed_at,
            tier_refreshed_at=d.tier_refreshed_at,
        )
        for i, d in doc.devices.items()
    }
    return Decoded(node=doc.node, written_at=doc.written_at, devices=devices)


# ---------------------------------------------------------------------------- file I/O

CorruptSink = Callable[[Path, str], None]
"""Told ``(moved_to, why)`` when a corrupt ledger file was moved aside."""


def _noop_corrupt(moved_to: Path, why: str) -> None:
    return None


class LedgerFile:
    """The ledger's file ``<state_dir>/ledger.json``, written through
    :class:`flexlease.atomicfile.AtomicFile` (one writer at a time, a unique temp file,
    fsync, rename, directory fsync). Synchronous (callers run it through
    ``asyncio.to_thread``). ``on_corrupt`` is told of every file moved aside (for the
    ``flexlease_ledger_corrupt_total`` metric); ``on_step`` of each step of a write (tests)."""

    NAME: Final = "ledger.json"

    def __init__(
        self,
        state_dir: Path,
        *,
        on_corrupt: CorruptSink = _noop_corrupt,
        on_step: atomicfile.StepHook | None = None,
    ) -> None:
        self.dir = state_dir
        self.path = state_dir / self.NAME
        self._on_corrupt = on_corrupt
        self._file = atomicfile.AtomicFile(self.path, on_step=on_step)

    def load(self) -> Decoded | None:
        """The stored ledger, or None when there is none (first start) or it was corrupt — in
        which case it was moved aside, logged at error level and reported to ``on_corrupt``.
        Leftover temp files of an interrupted write are removed. Raises ``OSError`` when the
        directory cannot be read or the corrupt file cannot be moved."""
        for tmp in self._file.remove_temps():
            log.warning("removed the temp file of an interrupted ledger write", extra=ctx(path=str(tmp)))
        data = self._file.read()
        if data is None:
            return None
        try:
            return decode(data)
        except ValueError as exc:
            moved = self._move_aside(str(exc))
            log.error(
                "availability ledger is corrupt; moved aside and starting a new one",
                extra=ctx(path=str(self.path), moved_to=str(moved), error=str(exc)),
            )
            self._on_corrupt(moved, str(exc))
            return None

    def _move_aside(self, why: str) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.NAME}.corrupt-{stamp}")
        with self._file.locked() as dir_fd:
            os.replace(self.path, target)
            os.fsync(dir_fd)
        return target

    def save(self, data: bytes, *, written_at: float | None = None) -> bool:
        """Replace the file with ``data`` (see :meth:`flexlease.atomicfile.AtomicFile.replace`):
        a write waits for the one in flight; one whose ``written_at`` is older than the last
        written by this process is skipped (returns False). Raises ``OSError``; the old file
        stays whole when the write fails before its rename."""
        return self._file.replace(data, version=written_at)


# ---------------------------------------------------------------------------- the node's ledger


@dataclass(frozen=True, slots=True)
class TierView:
    """What status and metrics show for one GPU."""

    availability: Availability
    tier: Tier
    tier_computed_at: float


class Ledger:
    """The node's ledger in memory: one :class:`DeviceLedger` per GPU index, the math above
    applied as the health watch reports transitions. Not thread-safe; lives on the event loop."""

    def __init__(
        self, node: str, thresholds: Thresholds, *, devices: dict[int, DeviceLedger] | None = None
    ) -> None:
        self.node = node
        self.thresholds = thresholds
        self.devices: dict[int, DeviceLedger] = dict(devices or {})

    @classmethod
    def restored(cls, node: str, thresholds: Thresholds, *, decoded: Decoded | None, now: float) -> Ledger:
        """The ledger after a restart at ``now``: each GPU's gap since the last write becomes
        unknown time. A file of another node is not used (logged)."""
        if decoded is None:
            return cls(node, thresholds)
        if decoded.node != node:
            log.error(
                "ledger belongs to another node; not used", extra=ctx(node=node, file_node=decoded.node)
            )
            return cls(node, thresholds)
        return cls(node, thresholds, devices={i: resume(d, now) for i, d in decoded.devices.items()})

    def adopt(self, identities: Iterable[tuple[int, Identity]], now: float) -> None:
        """Align with the GPUs NVML enumerated: a new index or a changed UUID starts a new
        history (from ``unknown`` at ``now``); indexes no longer present are dropped."""
        seen: dict[int, DeviceLedger] = {}
        for index, ident in identities:
            old = self.devices.get(index)
            if old is not None and old.identity.uuid == ident.uuid:
                seen[index] = replace(old, identity=ident)
            else:
                if old is not None:
                    log.info("GPU replaced; new availability history", extra=ctx(gpu=index, uuid=ident.uuid))
                seen[index] = new(ident, Span.UNKNOWN, at=now)
        for index in self.devices.keys() - seen.keys():
            log.info("GPU gone; its availability history is dropped", extra=ctx(gpu=index))
        self.devices = seen

    def record(self, index: int, health: Health, *, at: float) -> None:
        """GPU ``index`` is ``health`` from ``at`` on. Raises ``KeyError`` for an unknown index."""
        self.devices[index] = record(self.devices[index], Span.of(health), at=at)

    def tick(self, now: float) -> dict[int, TierView]:
        """Advance every GPU to ``now``, prune, re-tier; return what to show."""
        th = self.thresholds
        out: dict[int, TierView] = {}
        for index, old in self.devices.items():
            pruned = prune(advance(old, now), now, window_seconds=th.window_seconds)
            avail = availability(pruned, now, window_seconds=th.window_seconds)
            before = pruned.tier
            dev = retier(pruned, avail.ratio, now=now, th=th)
            if before is not None and dev.tier is not None and dev.tier != before:
                log.info(
                    "GPU tier changed",
                    extra=ctx(
                        node=self.node, gpu=index, tier=dev.tier.value, was=before.value, ratio=avail.ratio
                    ),
                )
            self.devices[index] = dev
            assert dev.tier is not None and dev.tier_computed_at is not None
            out[index] = TierView(availability=avail, tier=dev.tier, tier_computed_at=dev.tier_computed_at)
        return out

    def snapshot(self, now: float) -> dict[int, DeviceLedger]:
        """Every GPU advanced to ``now``: immutable values, safe to :func:`encode` in a worker
        thread while the loop goes on."""
        self.devices = {i: advance(d, now) for i, d in self.devices.items()}
        return dict(self.devices)

    def encode(self, now: float) -> bytes:
        """File content as of ``now`` (every GPU advanced to ``now``)."""
        return encode(self.node, self.snapshot(now), written_at=now)
