"""The real GPU backend on NVIDIA's NVML through ``nvidia-ml-py`` (module ``pynvml``).

NVML calls block, so each runs in a worker thread (``asyncio.to_thread``). Health comes from
an NVML event set (``nvmlEventSetCreate``; ``nvmlDeviceRegisterEvents`` with
``nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
nvmlEventTypeSingleBitEccError`` masked by what the GPU supports; ``nvmlEventSetWait_v2``,
whose ``eventData`` is the XID number for XID events) and from periodic queries
(``nvmlDeviceGetTemperature``, ``nvmlDeviceGetRetiredPagesPendingStatus``,
``nvmlDeviceGetRemappedRows``). The same event mask and the fall-off-the-bus handling are what
NVIDIA's k8s-device-plugin uses (``NVIDIA/k8s-device-plugin: internal/rm/health.go``).

``nvmlDeviceRegisterEvents`` fails with ``NVML_ERROR_NOT_SUPPORTED`` when the mask holds any
type the GPU does not support (NVML API reference, ``nvmlDeviceRegisterEvents``: "if the
platform does not support this feature or some of requested event types"), and GPUs without
ECC reporting support no ECC events. So each GPU is registered with
``HEALTH_EVENTS & nvmlDeviceGetSupportedEventTypes(handle)``, as the device plugin does: a
GPU without ECC events still gets its XID events.

Error codes (``pynvml.NVMLError.value``): ``NVML_ERROR_GPU_IS_LOST`` marks the GPU lost;
``NVML_ERROR_NOT_SUPPORTED`` disables that one call for that GPU (older GPUs lack row
remapping, newer ones page retirement); ``NVML_ERROR_TIMEOUT`` from the event wait means "no
event". Anything else is raised as :class:`flexlease.errors.NvmlError` with the cause
chained, after being counted through ``on_error``.

``python -m nodeagent.health.nvml`` prints what the backend sees on this machine (devices,
one query each, one event wait) — a probe for a GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import Any, Final, TypeVar

import pynvml

from flexlease.errors import NvmlError
from flexlease.logging import ctx
from nodeagent.health.backend import DeviceEvent, DeviceInfo, DeviceSample, EventKind

log = logging.getLogger(__name__)

_T = TypeVar("_T")

ErrorSink = Callable[[str, str], None]
"""``(nvml_call, error_name)``: told of every NVML error, for ``flexlease_nvml_errors_total``."""

_MIB: Final = 1024 * 1024
_DRAIN_MAX: Final = 256
"""Events taken from the set in one :meth:`NvmlBackend.wait_events` after the first."""


def _error_name(exc: Exception) -> str:
    """``NVMLError_GpuIsLost`` → ``GpuIsLost``; the class name for anything else."""
    return type(exc).__name__.removeprefix("NVMLError_")


def _noop_sink(call: str, error: str) -> None:
    return None


class NvmlBackend:
    """:class:`nodeagent.health.backend.GpuBackend` on the real NVML.

    ``nvml`` is the ``pynvml`` module (tests patch its functions); ``on_error`` is told of each
    NVML error as ``(call, error name)``.
    """

    def __init__(self, *, nvml: ModuleType = pynvml, on_error: ErrorSink = _noop_sink) -> None:
        self._nvml = nvml
        self._on_error = on_error
        self._handles: dict[int, Any] = {}
        self._by_uuid: dict[str, int] = {}
        self._event_set: Any = None
        self._lock = threading.Lock()
        """Held across every use of the event set, so ``stop`` never frees it under a waiter."""
        self._unsupported: set[tuple[int, str]] = set()
        self._registered: dict[int, int] = {}
        self._pending: list[DeviceEvent] = []
        self._initialised = False
        self._driver: str | None = None

    @property
    def event_mask(self) -> int:
        """The NVML event types the agent wants on every GPU (XID, double- and single-bit
        ECC); each GPU is registered with the part of it that the GPU supports (see
        :attr:`registered_masks`)."""
        n = self._nvml
        mask = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
        return int(mask | n.nvmlEventTypeSingleBitEccError)

    @property
    def registered_masks(self) -> dict[int, int]:
        """GPU index → the event mask registered on it; GPUs with no registered event (none
        supported, or lost) are absent and rely on periodic queries."""
        return dict(self._registered)

    @property
    def driver_version(self) -> str | None:
        return self._driver

    def _is(self, exc: BaseException, code_name: str) -> bool:
        n = self._nvml
        return isinstance(exc, n.NVMLError) and getattr(exc, "value", None) == getattr(n, code_name)

    def _fail(self, call: str, exc: Exception, *, index: int | None = None) -> NvmlError:
        self._on_error(call, _error_name(exc))
        where = f" on GPU {index}" if index is not None else ""
        return NvmlError(f"{call}{where} failed: {exc}")

    # ------------------------------------------------------------------ start

    async def start(self) -> list[DeviceInfo]:
        """``nvmlInit``, enumerate, register events. Raises ``NvmlError`` when NVML cannot
        start (no driver, no library) or the devices cannot be counted."""
        return await asyncio.to_thread(self._start_sync)

    def _start_sync(self) -> list[DeviceInfo]:
        n = self._nvml
        try:
            n.nvmlInit()
        except n.NVMLError as exc:
            raise self._fail("nvmlInit", exc) from exc
        self._initialised = True
        try:
            self._driver = str(n.nvmlSystemGetDriverVersion())
        except n.NVMLError as exc:
            self._on_error("nvmlSystemGetDriverVersion", _error_name(exc))
        try:
            count = int(n.nvmlDeviceGetCount())
            self._event_set = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            raise self._fail("nvmlDeviceGetCount/nvmlEventSetCreate", exc) from exc
        devices = [self._enumerate(i) for i in range(count)]
        return devices

    def _enumerate(self, index: int) -> DeviceInfo:
        """One device; a GPU lost during enumeration is reported with empty identity and a
        pending LOST event, never as a healthy device."""
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            uuid = str(n.nvmlDeviceGetUUID(handle))
            model = str(n.nvmlDeviceGetName(handle))
            memory_mib = int(n.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        except n.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
                self._on_error("nvmlDeviceGetHandleByIndex", _error_name(exc))
                log.error("GPU is lost during enumeration", extra=ctx(gpu=index))
                self._pending.append(DeviceEvent(index=index, kind=EventKind.LOST, at=time.time()))
                return DeviceInfo(index=index, uuid="", model="", memory_mib=0)
            raise self._fail("device enumeration", exc, index=index) from exc
        self._handles[index] = handle
        self._by_uuid[uuid] = index
        pci = self._optional(
            index, "nvmlDeviceGetPciInfo", fn=lambda: str(n.nvmlDeviceGetPciInfo(handle).busId)
        )
        minor = self._optional(
            index, "nvmlDeviceGetMinorNumber", fn=lambda: int(n.nvmlDeviceGetMinorNumber(handle))
        )
        self._register(index, handle)
        return DeviceInfo(
            index=index, uuid=uuid, model=model, memory_mib=memory_mib, pci_bus_id=pci, minor_number=minor
        )

    def _register(self, index: int, handle: Any) -> None:
        """Register the health events GPU ``index`` supports. A lost GPU gets a pending LOST
        event; a GPU that supports none of them (or refuses registration with
        ``NOT_SUPPORTED``) is left to periodic queries."""
        n = self._nvml
        try:
            supported = self._optional(
                index,
                "nvmlDeviceGetSupportedEventTypes",
                fn=lambda: int(n.nvmlDeviceGetSupportedEventTypes(handle)),
            )
            mask = self.event_mask & (supported if supported is not None else 0)
            if mask == 0:
                log.warning(
                    "GPU supports none of the NVML health events; health from periodic queries only",
                    extra=ctx(gpu=index, supported_events=hex(supported or 0)),
                )
                return
            if mask != self.event_mask:
                log.info(
                    "GPU supports only part of the NVML health events",
                    extra=ctx(gpu=index, event_mask=hex(mask)),
                )
            with self._lock:
                n.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            self._registered[index] = mask
        except n.NVMLError as exc:
            self._on_error("nvmlDeviceRegisterEvents", _error_name(exc))
            if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
                self._pending.append(DeviceEvent(index=index, kind=EventKind.LOST, at=time.time()))
                return
            if not self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                raise self._fail("nvmlDeviceRegisterEvents", exc, index=index) from exc
            log.warning(
                "GPU does not support NVML health events; health from periodic queries only",
                extra=ctx(gpu=index),
            )

    def _optional(self, index: int, call: str, *, fn: Callable[[], _T]) -> _T | None:
        """``fn()``, or None when NVML says NOT_SUPPORTED (remembered: not asked again for
        this GPU). Raises ``pynvml.NVMLError`` for anything else."""
        if (index, call) in self._unsupported:
            return None
        try:
            return fn()
        except self._nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                self._unsupported.add((index, call))
                log.info("NVML call not supported", extra=ctx(gpu=index, call=call))
                return None
            raise

    # ------------------------------------------------------------------ events

    async def wait_events(self, timeout_seconds: float) -> list[DeviceEvent]:
        """Wait up to ``timeout_seconds`` (rounded to ms) on the event set; then take what else
        is queued. ``GPU_IS_LOST`` during the wait becomes LOST events for every GPU that a
        probe finds lost (every GPU when none can be singled out)."""
        if self._pending:
            out, self._pending = self._pending, []
            return out
        if self._event_set is None:
            await asyncio.sleep(timeout_seconds)
            return []
        return await asyncio.to_thread(self._wait_sync, max(0, round(timeout_seconds * 1000)))

    def _wait_sync(self, timeout_ms: int) -> list[DeviceEvent]:
        n = self._nvml
        out: list[DeviceEvent] = []
        with self._lock:
            if self._event_set is None:
                return out
            wait_ms = timeout_ms
            for _ in range(_DRAIN_MAX + 1):
                try:
                    data = n.nvmlEventSetWait_v2(self._event_set, wait_ms)
                except n.NVMLError as exc:
                    if self._is(exc, "NVML_ERROR_TIMEOUT"):
                        break
                    self._on_error("nvmlEventSetWait_v2", _error_name(exc))
                    if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
                        out.extend(self._lost_events())
                        break
                    raise NvmlError(f"nvmlEventSetWait_v2 failed: {exc}") from exc
                event = self._to_event(data)
                if event is not None:
                    out.append(event)
                wait_ms = 0
        return out

    def _to_event(self, data: Any) -> DeviceEvent | None:
        n = self._nvml
        now = time.time()
        try:
            index = self._by_uuid.get(str(n.nvmlDeviceGetUUID(data.device)))
        except n.NVMLError as exc:
            self._on_error("nvmlDeviceGetUUID", _error_name(exc))
            index = None
        if index is None:
            log.warning("NVML event from an unknown device", extra=ctx(event_type=int(data.eventType)))
            return None
        etype = int(data.eventType)
        if etype & n.nvmlEventTypeXidCriticalError:
            return DeviceEvent(index=index, kind=EventKind.XID, at=now, xid=int(data.eventData))
        if etype & n.nvmlEventTypeDoubleBitEccError:
            return DeviceEvent(index=index, kind=EventKind.DOUBLE_BIT_ECC, at=now)
        if etype & n.nvmlEventTypeSingleBitEccError:
            return DeviceEvent(index=index, kind=EventKind.SINGLE_BIT_ECC, at=now)
        log.debug("NVML event of an unregistered type", extra=ctx(gpu=index, event_type=etype))
        return None

    def _lost_events(self) -> list[DeviceEvent]:
        now = time.time()
        lost = [i for i in sorted(self._handles) if self._query_sync(i).lost]
        if not lost:
            log.error("NVML reports a lost GPU but no probe singles it out; marking every GPU lost")
            lost = sorted(self._handles)
        return [DeviceEvent(index=i, kind=EventKind.LOST, at=now) for i in lost]

    # ------------------------------------------------------------------ queries

    async def query(self, index: int) -> DeviceSample:
        """Temperature, retired pages pending, remapped rows; ``lost`` on ``GPU_IS_LOST``.
        Raises ``NvmlError`` for an unknown index or an unexpected NVML error."""
        return await asyncio.to_thread(self._query_sync, index)

    def _query_sync(self, index: int) -> DeviceSample:
        n = self._nvml
        now = time.time()
        handle = self._handles.get(index)
        if handle is None:
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
            except n.NVMLError as exc:
                if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
                    self._on_error("nvmlDeviceGetHandleByIndex", _error_name(exc))
                    return DeviceSample(index=index, at=now, lost=True)
                raise self._fail("nvmlDeviceGetHandleByIndex", exc, index=index) from exc
        call = "nvmlDeviceGetTemperature"
        try:
            temp = self._optional(
                index, call, fn=lambda: int(n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU))
            )
            call = "nvmlDeviceGetRetiredPagesPendingStatus"
            pages = self._optional(
                index, call, fn=lambda: int(n.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            )
            call = "nvmlDeviceGetRemappedRows"
            rows = self._optional(index, call, fn=lambda: tuple(n.nvmlDeviceGetRemappedRows(handle)))
        except n.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
                self._on_error(call, _error_name(exc))
                return DeviceSample(index=index, at=now, lost=True)
            raise self._fail(call, exc, index=index) from exc
        return DeviceSample(
            index=index,
            at=now,
            temperature_c=temp,
            retired_pages_pending=None if pages is None else pages == n.NVML_FEATURE_ENABLED,
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failure=None if rows is None else bool(rows[3]),
        )

    # ------------------------------------------------------------------ stop

    async def stop(self) -> None:
        """Free the event set (after any wait in flight ends) and ``nvmlShutdown``. Errors are
        counted and logged, never raised: stopping must not fail."""
        await asyncio.to_thread(self._stop_sync)

    def _stop_sync(self) -> None:
        n = self._nvml
        with self._lock:
            event_set, self._event_set = self._event_set, None
        if event_set is not None:
            try:
                n.nvmlEventSetFree(event_set)
            except n.NVMLError as exc:
                self._on_error("nvmlEventSetFree", _error_name(exc))
                log.warning("nvmlEventSetFree failed", extra=ctx(error=str(exc)))
        if self._initialised:
            self._initialised = False
            try:
                n.nvmlShutdown()
            except n.NVMLError as exc:
                self._on_error("nvmlShutdown", _error_name(exc))
                log.warning("nvmlShutdown failed", extra=ctx(error=str(exc)))
        self._handles.clear()
        self._by_uuid.clear()
        self._registered.clear()


# ---------------------------------------------------------------------- probe


async def probe(*, wait_seconds: float = 5.0) -> dict[str, Any]:
    """What the backend sees here: driver, devices, one query per GPU, one event wait.
    Returns a JSON-ready dict; raises ``NvmlError`` when NVML cannot start."""
    errors: list[str] = []
    backend = NvmlBackend(on_error=lambda call, err: errors.append(f"{call}: {err}"))
    try:
        devices = await backend.start()
        masks = backend.registered_masks
        samples = [asdict(await backend.query(d.index)) for d in devices]
        started = time.monotonic()
        events = await backend.wait_events(wait_seconds)
        waited = time.monotonic() - started
    finally:
        await backend.stop()
    return {
        "driverVersion": backend.driver_version,
        "eventMask": hex(backend.event_mask),
        "registeredEventMasks": {str(i): hex(m) for i, m in masks.items()},
        "devices": [asdict(d) for d in devices],
        "samples": samples,
        "eventWait": {"timeoutSeconds": wait_seconds, "waitedSeconds": round(waited, 3)},
        "events": [asdict(e) for e in events],
        "nvmlErrors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m nodeagent.health.nvml [--wait SECONDS]``: print :func:`probe` as JSON.
    Exit status 1 when NVML cannot start."""
    parser = argparse.ArgumentParser(description="Print what flexlease's NVML backend sees on this machine.")
    parser.add_argument("--wait", type=float, default=5.0, help="seconds to wait for one NVML event")
    args = parser.parse_args(argv)
    try:
        report = asyncio.run(probe(wait_seconds=args.wait))
    except NvmlError as exc:
        print(json.dumps({"error": str(exc), "cause": repr(exc.__cause__)}, indent=2))
        return 1
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
