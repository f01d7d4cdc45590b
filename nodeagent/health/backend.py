"""The GPU backend seam: what the health watch needs from NVML, and nothing more.

Two implementations share this Protocol: :mod:`nodeagent.health.nvml` (``nvidia-ml-py``,
the real NVML) and :mod:`nodeagent.health.simulated` (a node described in YAML with a script
of XIDs and fall-off-the-bus events). The watch calls :meth:`GpuBackend.start` once, then
loops on :meth:`GpuBackend.wait_events` (NVML's event set: XID critical errors, single- and
double-bit ECC errors) and periodically :meth:`GpuBackend.query` (temperature, retired pages,
remapped rows, lost/ok). Every failure is raised as :class:`flexlease.errors.NvmlError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU as NVML enumerates it. ``index`` is NVML's device index; ``memory_mib`` the
    total framebuffer in MiB; ``pci_bus_id`` as ``0000:3B:00.0``; ``minor_number`` the N of
    ``/dev/nvidiaN`` (None where unknown)."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str | None = None
    minor_number: int | None = None


class EventKind(enum.StrEnum):
    """What an event reports. ``XID``: an XID error (``xid`` holds its number);
    ``DOUBLE_BIT_ECC`` / ``SINGLE_BIT_ECC``: ECC errors; ``LOST``: the GPU fell off the bus
    (``NVML_ERROR_GPU_IS_LOST``)."""

    XID = "xid"
    DOUBLE_BIT_ECC = "dbe"
    SINGLE_BIT_ECC = "sbe"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One event on GPU ``index`` observed at ``at`` (epoch seconds, the agent's clock)."""

    index: int
    kind: EventKind
    at: float
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One periodic query of GPU ``index`` at ``at`` (epoch seconds).

    ``lost``: NVML answered ``GPU_IS_LOST``. Fields are None where the GPU or driver does not
    support the query (``NVML_ERROR_NOT_SUPPORTED``) or it was lost. ``temperature_c``: core
    temperature, °C. ``retired_pages_pending``: a page retirement waits for a reset (pre-Ampere).
    ``remapped_rows_pending`` / ``remapped_rows_failure``: row remapping (Ampere and later)
    waits for a reset / has failed, in which case the GPU needs service.
    """

    index: int
    at: float
    lost: bool = False
    temperature_c: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    @property
    def ok(self) -> bool:
        """True when nothing in the sample makes the GPU unusable (not lost, no failed row remap)."""
        return not self.lost and not self.remapped_rows_failure

    @property
    def problem(self) -> str | None:
        """Why the sample is not ok, in words; None when ok."""
        if self.lost:
            return "GPU is lost (fallen off the bus)"
        if self.remapped_rows_failure:
            return "row remapping failed"
        return None


@runtime_checkable
class GpuBackend(Protocol):
    """NVML as the node agent sees it. All methods raise :class:`flexlease.errors.NvmlError`."""

    async def start(self) -> list[DeviceInfo]:
        """Initialise (``nvmlInit``), enumerate the GPUs and subscribe to their events.
        Returns the devices ordered by index. Raises ``NvmlError`` when NVML cannot start."""
        ...

    async def wait_events(self, timeout_seconds: float) -> list[DeviceEvent]:
        """Events that arrived, waiting up to ``timeout_seconds`` for the first one; an empty
        list on timeout."""
        ...

    async def query(self, index: int) -> DeviceSample:
        """Query GPU ``index`` now (temperature, retired pages, remapped rows, lost/ok)."""
        ...

    async def stop(self) -> None:
        """Release event sets and shut NVML down. Safe to call after a failed ``start``."""
        ...

    @property
    def driver_version(self) -> str | None:
        """The driver version once started (None before, or when unknown)."""
        ...
