"""A simulated GPU backend: the :class:`~nodeagent.health.backend.GpuBackend` interface over a
node described in YAML and a script of events, driven by an injectable clock.

Used by the tests, the demo (``flexlease-agent --nvml=simulated --node-config=FILE``) and
the simulator. The node file::

    gpus:                     # N identical GPUs ...
      count: 8
      model: NVIDIA H20
      memoryMiB: 97871
      uuids: [GPU-…, …]       # optional; derived from the node name otherwise
    devices:                  # ... or an explicit list (instead of ``gpus``)
      - {uuid: GPU-…, model: NVIDIA A100-SXM4-80GB, memoryMiB: 81920}
    nvmlInitFails: false      # true: start() fails as nvmlInit does without a driver
    events:                   # seconds after start(), on GPU index ``gpu``
      - {at: 3600, gpu: 2, event: xid, xid: 79}
      - {at: 3700, gpu: 2, event: lost}        # fallen off the bus
      - {at: 5400, gpu: 2, event: recovered}   # queries look healthy again
      - {at: 9000, gpu: 1, event: dbe}         # also: sbe

XID, ECC and ``lost`` entries are delivered by :meth:`SimulatedBackend.wait_events` once the
clock reaches them; ``lost`` also makes :meth:`SimulatedBackend.query` report the GPU lost
until a ``recovered`` entry. Tests may also :meth:`SimulatedBackend.inject` events at run time.

Real NVML behaviour reproduced: the event types a GPU supports depend on its model
(``nvmlDeviceGetSupportedEventTypes``; NVML API reference, "Event Handling Methods"). GPUs
without ECC reporting (GeForce boards; or ``ecc: false`` on a ``gpus`` group or device entry)
deliver no single- or double-bit ECC events, so a script or an injection of one on such a
GPU is refused as impossible rather than delivered.
"""

from __future__ import annotations

import enum
import uuid as uuidlib
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flexlease.clock import Clock
from flexlease.errors import NvmlError
from nodeagent.health.backend import DeviceEvent, DeviceInfo, DeviceSample, EventKind


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ScriptAction(enum.StrEnum):
    """What a script entry does to its GPU."""

    XID = "xid"
    DBE = "dbe"
    SBE = "sbe"
    LOST = "lost"
    RECOVERED = "recovered"


class ScriptEvent(_Model):
    """One script entry: ``event`` on GPU ``gpu`` at ``at`` seconds after start."""

    at: float = Field(ge=0)
    gpu: int = Field(ge=0)
    event: ScriptAction
    xid: int | None = Field(default=None, ge=0)
    temperature_c: int | None = Field(default=None, alias="temperatureC")

    @model_validator(mode="after")
    def _xid_given(self) -> Self:
        if (self.event is ScriptAction.XID) != (self.xid is not None):
            raise ValueError("an entry has `xid` exactly when its event is `xid`")
        return self


class GpuGroup(_Model):
    """``count`` identical GPUs."""

    count: int = Field(ge=0, le=64)
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = Field(default=81559, alias="memoryMiB", gt=0)
    uuids: list[str] | None = None
    ecc: bool | None = None
    """Whether the GPUs report ECC errors (and so ECC events); None: from the model."""

    @model_validator(mode="after")
    def _uuid_count(self) -> Self:
        if self.uuids is not None and len(self.uuids) != self.count:
            raise ValueError(f"gpus.uuids has {len(self.uuids)} entries for {self.count} GPUs")
        return self


class GpuEntry(_Model):
    uuid: str | None = None
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = Field(default=81559, alias="memoryMiB", gt=0)
    ecc: bool | None = None
    """Whether the GPU reports ECC errors (and so ECC events); None: from the model."""

    def supported_events(self) -> frozenset[EventKind]:
        """The event kinds this GPU can deliver: XID and LOST always; ECC kinds when it
        reports ECC (GeForce boards do not)."""
        ecc = self.ecc if self.ecc is not None else "GeForce" not in self.model
        return ALL_EVENTS if ecc else NO_ECC_EVENTS


class NodeConfig(_Model):
    """A simulated node: its GPUs (``gpus`` or ``devices``), an event script, and whether NVML
    fails to initialise."""

    name: str = "sim-node"
    gpus: GpuGroup | None = None
    devices: list[GpuEntry] | None = None
    events: list[ScriptEvent] = Field(default_factory=list)
    nvml_init_fails: bool = Field(default=False, alias="nvmlInitFails")
    temperature_c: int = Field(default=35, alias="temperatureC")

    @model_validator(mode="after")
    def _one_shape(self) -> Self:
        if (self.gpus is None) == (self.devices is None):
            raise ValueError("give exactly one of `gpus` and `devices`")
        n = len(self.device_infos())
        uuids = [d.uuid for d in self.device_infos()]
        if len(set(uuids)) != n:
            raise ValueError("GPU UUIDs must be unique")
        entries = self.entries()
        for e in self.events:
            if e.gpu >= n:
                raise ValueError(f"script entry at {e.at}s names GPU {e.gpu}, but the node has {n}")
            kind = _KIND.get(e.event)
            if kind is not None and kind not in entries[e.gpu].supported_events():
                raise ValueError(
                    f"script entry at {e.at}s: GPU {e.gpu} ({entries[e.gpu].model}) "
                    f"supports no {e.event.value} events (no ECC reporting)"
                )
        return self

    def entries(self) -> list[GpuEntry]:
        """The GPUs as entries, ordered by index (a ``gpus`` group expanded)."""
        if self.gpus is not None:
            g = self.gpus
            ids: list[str | None] = list(g.uuids) if g.uuids else [None] * g.count
            return [GpuEntry(uuid=u, model=g.model, memory_mib=g.memory_mib, ecc=g.ecc) for u in ids]
        return list(self.devices or [])

    def device_infos(self) -> list[DeviceInfo]:
        """The GPUs, ordered by index. Missing UUIDs are derived from the node name and index
        (stable across runs), in NVML's ``GPU-<uuid>`` form."""
        return [
            DeviceInfo(
                index=i,
                uuid=e.uuid or _sim_uuid(self.name, i),
                model=e.model,
                memory_mib=e.memory_mib,
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                minor_number=i,
            )
            for i, e in enumerate(self.entries())
        ]


def _sim_uuid(node: str, index: int) -> str:
    """A stable NVML-style UUID for a simulated GPU: ``GPU-`` + UUIDv5 of node and index."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'flexlease-sim/{node}/{index}')}"


def load_node_config(path: Path) -> NodeConfig:
    """Read a node file. Raises ``OSError`` when unreadable, ``pydantic.ValidationError`` (a
    ``ValueError``) when malformed."""
    data: Any = yaml.safe_load(path.read_text())
    return NodeConfig.model_validate(data if data is not None else {})


ALL_EVENTS: frozenset[EventKind] = frozenset(EventKind)
NO_ECC_EVENTS: frozenset[EventKind] = frozenset({EventKind.XID, EventKind.LOST})

_KIND = {
    ScriptAction.XID: EventKind.XID,
    ScriptAction.DBE: EventKind.DOUBLE_BIT_ECC,
    ScriptAction.SBE: EventKind.SINGLE_BIT_ECC,
    ScriptAction.LOST: EventKind.LOST,
}


class SimulatedBackend:
    """:class:`~nodeagent.health.backend.GpuBackend` playing ``config``'s script on ``clock``.
    Script times count from :meth:`start`."""

    def __init__(self, config: NodeConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._script = sorted(config.events, key=lambda e: e.at)
        self._next = 0
        self._t0: float | None = None
        self._lost: set[int] = set()
        self._temps: dict[int, int] = {}
        self._injected: list[DeviceEvent] = []
        self._devices = config.device_infos()
        self._supported = [e.supported_events() for e in config.entries()]

    @property
    def driver_version(self) -> str | None:
        return "simulated" if self._t0 is not None else None

    async def start(self) -> list[DeviceInfo]:
        """Start the script clock; raises ``NvmlError`` when the node says ``nvmlInitFails``."""
        if self._config.nvml_init_fails:
            raise NvmlError("nvmlInit failed: NVML Shared Library Not Found (simulated)")
        self._t0 = self._clock.now()
        return list(self._devices)

    def supported_events(self, index: int) -> frozenset[EventKind]:
        """The event kinds GPU ``index`` can deliver (no ECC kinds without ECC reporting)."""
        return self._supported[index]

    def inject(self, event: DeviceEvent) -> None:
        """Deliver ``event`` at the next :meth:`wait_events`; a LOST event also marks the GPU
        lost until :meth:`recover`. Raises ``ValueError`` for an event kind the GPU cannot
        deliver (ECC on a GPU without ECC reporting)."""
        if event.kind not in self._supported[event.index]:
            raise ValueError(f"GPU {event.index} supports no {event.kind.value} events (no ECC reporting)")
        if event.kind is EventKind.LOST:
            self._lost.add(event.index)
        self._injected.append(event)

    def recover(self, index: int) -> None:
        """GPU ``index`` answers queries as healthy again."""
        self._lost.discard(index)

    def _due(self) -> list[DeviceEvent]:
        assert self._t0 is not None
        now = self._clock.now()
        out, self._injected = self._injected, []
        while self._next < len(self._script) and self._t0 + self._script[self._next].at <= now:
            entry = self._script[self._next]
            self._next += 1
            at = self._t0 + entry.at
            if entry.temperature_c is not None:
                self._temps[entry.gpu] = entry.temperature_c
            if entry.event is ScriptAction.RECOVERED:
                self._lost.discard(entry.gpu)
                continue
            if entry.event is ScriptAction.LOST:
                self._lost.add(entry.gpu)
            out.append(DeviceEvent(index=entry.gpu, kind=_KIND[entry.event], at=at, xid=entry.xid))
        return out

    async def wait_events(self, timeout_seconds: float) -> list[DeviceEvent]:
        """Script entries and injected events that are due, sleeping on the clock up to
        ``timeout_seconds`` (or until the next entry) when none is. Raises ``NvmlError``
        before :meth:`start`."""
        if self._t0 is None:
            raise NvmlError("simulated backend not started")
        due = self._due()
        if due:
            return due
        wait = timeout_seconds
        if self._next < len(self._script):
            wait = min(wait, self._t0 + self._script[self._next].at - self._clock.now())
        await self._clock.sleep(wait)
        return self._due()

    async def query(self, index: int) -> DeviceSample:
        """The GPU's state now: lost (between ``lost`` and ``recovered``), else healthy with
        the configured temperature. Raises ``NvmlError`` for an unknown index or before start."""
        if self._t0 is None:
            raise NvmlError("simulated backend not started")
        if not 0 <= index < len(self._devices):
            raise NvmlError(f"no simulated GPU {index}")
        now = self._clock.now()
        lost, temps = self._now_state()
        if index in lost:
            return DeviceSample(index=index, at=now, lost=True)
        return DeviceSample(
            index=index,
            at=now,
            temperature_c=temps.get(index, self._config.temperature_c),
            retired_pages_pending=None,
            remapped_rows_pending=False,
            remapped_rows_failure=False,
        )

    def _now_state(self) -> tuple[set[int], dict[int, int]]:
        """Lost GPUs and temperatures now, counting due entries that the watch has not taken
        yet (a query may run before the events are delivered)."""
        assert self._t0 is not None
        now = self._clock.now()
        lost, temps = set(self._lost), dict(self._temps)
        for entry in self._script[self._next :]:
            if self._t0 + entry.at > now:
                break
            if entry.temperature_c is not None:
                temps[entry.gpu] = entry.temperature_c
            if entry.event is ScriptAction.LOST:
                lost.add(entry.gpu)
            elif entry.event is ScriptAction.RECOVERED:
                lost.discard(entry.gpu)
        return lost, temps

    async def stop(self) -> None:
        self._t0 = None
