"""The agent's in-memory picture of its GPUs: what NVML enumerated, each GPU's health, the
last query, and the ledger's availability and tier.

Written by the health watch (devices, events, samples) and the ledger keeper (tiers), read by
the status reporter and the metrics collector at scrape time, all on the event loop. Every
health transition is recorded in the :class:`~nodeagent.ledger.Ledger` at the moment it
happens, so the ledger's intervals are exact. :attr:`NodeBoard.changed` is set on every change
that the ``GPUNode`` status shows; the status reporter clears it when it wakes.
"""

from __future__ import annotations

import asyncio
import logging

from flexlease.api.resources import Health
from flexlease.logging import ctx
from nodeagent import ledger
from nodeagent.health.backend import DeviceEvent, DeviceInfo, DeviceSample
from nodeagent.health.policy import GpuHealth, HealthPolicy

log = logging.getLogger(__name__)


class NodeBoard:
    """GPU state of one node. ``policy`` decides health; ``ledger`` records it."""

    def __init__(self, node: str, policy: HealthPolicy, *, book: ledger.Ledger) -> None:
        self.node = node
        self.policy = policy
        self.ledger = book
        self.devices: dict[int, ledger.Identity] = {}
        self.health: dict[int, GpuHealth] = {}
        self.samples: dict[int, DeviceSample] = {}
        self.tiers: dict[int, ledger.TierView] = {}
        self.nvml_up: bool | None = None
        """None before the first attempt to start NVML; False while it is down."""
        self.nvml_error: str | None = None
        self.driver_version: str | None = None
        self.changed = asyncio.Event()
        self.version = 0
        self._subscribers: set[asyncio.Event] = set()

    def _bump(self) -> None:
        self.version += 1
        self.changed.set()
        for event in self._subscribers:
            event.set()

    def subscribe(self) -> asyncio.Event:
        """An event of the caller's own, set at every change :attr:`changed` is set for (the
        caller clears it); for readers other than the status reporter, e.g. the device
        plugin's ``ListAndWatch``. Release it with :meth:`unsubscribe`."""
        event = asyncio.Event()
        self._subscribers.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        """Stop setting ``event`` (no-op when not subscribed)."""
        self._subscribers.discard(event)

    def set_devices(self, devices: list[DeviceInfo], now: float) -> None:
        """NVML (re)started at ``now`` and enumerated ``devices``: adopt them in the ledger and
        start each ``Unknown`` until queried, remembering an unhealthy stretch that reached up
        to the agent's restart (so the recovery hold-down spans restarts)."""
        idents = [
            (
                d.index,
                ledger.Identity(
                    uuid=d.uuid,
                    model=d.model,
                    memory_mib=d.memory_mib,
                    pci_bus_id=d.pci_bus_id,
                    minor_number=d.minor_number,
                ),
            )
            for d in devices
        ]
        self.ledger.adopt(idents, now)
        self.devices = dict(idents)
        previous = self.health
        self.health = {}
        for index in self.devices:
            prior = previous.get(index)
            last_bad = prior.last_bad_at if prior is not None else None
            if last_bad is None:
                last_bad = self.ledger.devices[index].unhealthy_until()
            self.health[index] = self.policy.resume(unhealthy_until=last_bad, now=now)
            self.ledger.record(index, Health.UNKNOWN, at=now)
        self.samples = {}
        self.nvml_up = True
        self.nvml_error = None
        self._bump()

    def set_backend_down(self, reason: str, now: float) -> None:
        """NVML is unavailable: every GPU known (enumerated before, or remembered by the ledger)
        becomes ``Unknown`` with ``reason``."""
        if not self.devices:
            self.devices = {i: d.identity for i, d in self.ledger.devices.items()}
        for index in self.devices:
            state = self.health.get(index)
            if state is None:
                book = self.ledger.devices.get(index)
                state = self.policy.resume(unhealthy_until=book.unhealthy_until() if book else None, now=now)
            self._set(index, self.policy.on_backend_down(state, reason, now), now)
        self.samples = {}
        if self.nvml_up is not False or self.nvml_error != reason:
            self.nvml_up = False
            self.nvml_error = reason
            self._bump()

    def set_backend_answering(self) -> None:
        """NVML answers again after failing rounds (the GPUs' health follows from the next
        samples)."""
        if self.nvml_up is False and self.devices:
            self.nvml_up = True
            self.nvml_error = None
            self._bump()

    def apply_event(self, event: DeviceEvent) -> GpuHealth | None:
        """Apply an NVML event; returns the new health (None for an unknown GPU index)."""
        state = self.health.get(event.index)
        if state is None:
            log.warning("event for a GPU not enumerated", extra=ctx(node=self.node, gpu=event.index))
            return None
        new = self.policy.on_event(state, event)
        self._set(event.index, new, event.at)
        return new

    def apply_sample(self, sample: DeviceSample) -> GpuHealth | None:
        """Apply a periodic query; returns the new health (None for an unknown GPU index)."""
        state = self.health.get(sample.index)
        if state is None:
            return None
        self.samples[sample.index] = sample
        new = self.policy.on_sample(state, sample)
        self._set(sample.index, new, sample.at)
        return new

    def _set(self, index: int, new: GpuHealth, at: float) -> None:
        old = self.health.get(index)
        self.health[index] = new
        if old == new:
            return
        if old is None or old.health is not new.health:
            self.ledger.record(index, new.health, at=at)
            level = logging.INFO if new.health is Health.HEALTHY else logging.WARNING
            log.log(
                level,
                "GPU health changed",
                extra=ctx(
                    node=self.node,
                    gpu=index,
                    health=new.health.value,
                    was=None if old is None else old.health.value,
                    reason=new.reason,
                ),
            )
        self._bump()

    def retier(self, now: float) -> None:
        """Advance the ledger to ``now`` and take its availability and tiers."""
        views = self.ledger.tick(now)
        old = {i: v.tier for i, v in self.tiers.items()}
        self.tiers = views
        if old != {i: v.tier for i, v in views.items()}:
            self._bump()
