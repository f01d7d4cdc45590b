"""The real ``pynvml`` code path of :class:`NvmlBackend`, with NVML's functions patched at the
``pynvml`` module attribute level (no GPU here). The fake returns pynvml's own ctypes structs
(``c_nvmlMemory_t``, ``nvmlPciInfo_t``, ``c_nvmlEventData_t``, device and event-set handles)
and raises pynvml's own ``NVMLError`` subclasses, as the C library would through pynvml.

Real NVML behaviours the fake reproduces (NVML API reference, "Event Handling Methods"):
``nvmlDeviceGetSupportedEventTypes`` answers a per-GPU mask, where GPUs without ECC reporting
(GeForce boards) lack the single- and double-bit ECC types; ``nvmlDeviceRegisterEvents``
fails with ``NVML_ERROR_NOT_SUPPORTED`` when the mask holds any type outside it ("if the
platform does not support this feature or some of requested event types"), which is why
NVIDIA's k8s-device-plugin (``internal/rm/health.go``) registers ``eventMask &
supportedEvents``; a lost GPU answers ``NVML_ERROR_GPU_IS_LOST`` to every device call."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from flexlease.errors import NvmlError
from nodeagent.health import nvml as nvml_mod
from nodeagent.health.backend import EventKind
from nodeagent.health.nvml import NvmlBackend

GIB = 1024**3

_ECC = pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
_BASE_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock


def supported_events(model: str) -> int:
    """The event types a GPU model supports: data-center GPUs report ECC errors, GeForce
    boards have no ECC and so no ECC events."""
    return _BASE_EVENTS if "GeForce" in model else _BASE_EVENTS | _ECC


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = 85520809984  # 81559 MiB, as nvidia-smi reports an H100 80GB
    bus_id: str = "00000000:18:00.0"
    minor: int = 0
    lost: bool = False
    not_supported: set[str] = field(default_factory=set)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    temperature: int = 41
    struct: Any = None
    events_supported: int | None = None

    def __post_init__(self) -> None:
        self.struct = pynvml.struct_c_nvmlDevice_t()
        if self.events_supported is None:
            self.events_supported = supported_events(self.name)


class FakeNvml:
    """The NVML C library as seen through pynvml."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.init_error: int | None = None
        self.events: list[Any] = []
        self.wait_error: int | None = None
        self.wait_timeouts: list[int] = []
        self.registered: dict[int, int] = {}
        self.register_error: dict[int, int] = {}
        self.calls: dict[str, int] = {}
        self.freed = False
        self.shutdown = False
        self.event_set_struct = pynvml.struct_c_nvmlEventSet_t()

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _gpu(self, handle: Any) -> FakeGpu:
        addr = ctypes.addressof(handle.contents)
        for g in self.gpus:
            if ctypes.addressof(g.struct) == addr:
                return g
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _check(self, g: FakeGpu, call: str) -> None:
        self._count(call)
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in g.not_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # pynvml functions -------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        g = self.gpus[index]
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return pynvml.c_nvmlDevice_t(g.struct)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        g = self._gpu(handle)
        return pynvml.c_nvmlMemory_t(total=g.total_bytes, free=g.total_bytes - GIB, used=GIB)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = g.bus_id.encode()
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetMinorNumber")
        return g.minor

    def nvmlEventSetCreate(self) -> Any:
        return pynvml.c_nvmlEventSet_t(self.event_set_struct)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetSupportedEventTypes")
        assert g.events_supported is not None
        return g.events_supported

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None:
        g = self._gpu(handle)
        index = self.gpus.index(g)
        if index in self.register_error:
            raise pynvml.NVMLError(self.register_error[index])
        self._check(g, "nvmlDeviceRegisterEvents")
        assert g.events_supported is not None
        if mask & ~g.events_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered[index] = mask

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.wait_timeouts.append(timeout_ms)
        if self.wait_error is not None:
            code, self.wait_error = self.wait_error, None
            raise pynvml.NVMLError(code)
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetTemperature")
        return g.temperature

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetRetiredPagesPendingStatus")
        return int(pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        g = self._gpu(handle)
        self._check(g, "nvmlDeviceGetRemappedRows")
        return g.remapped

    # helpers ------------------------------------------------------------------------

    def event(self, index: int, event_type: int, data: int = 0) -> None:
        handle = pynvml.c_nvmlDevice_t(self.gpus[index].struct)
        self.events.append(pynvml.c_nvmlEventData_t(device=handle, eventType=event_type, eventData=data))


PATCHED = [name for name in vars(FakeNvml) if name.startswith("nvml")]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    gpus = [
        FakeGpu(uuid="GPU-5d2b3c1e-0000-4000-8000-000000000000", bus_id="00000000:18:00.0", minor=0),
        FakeGpu(uuid="GPU-5d2b3c1e-0000-4000-8000-000000000001", bus_id="00000000:2A:00.0", minor=1),
    ]
    f = FakeNvml(gpus)
    for name in PATCHED:
        monkeypatch.setattr(pynvml, name, getattr(f, name))
    return f


class Errors:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, call: str, error: str) -> None:
        self.seen.append((call, error))


async def test_start_enumerates_devices_and_registers_health_events(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    devices = await backend.start()
    assert [(d.index, d.uuid, d.model, d.memory_mib, d.pci_bus_id, d.minor_number) for d in devices] == [
        (
            0,
            "GPU-5d2b3c1e-0000-4000-8000-000000000000",
            "NVIDIA H100 80GB HBM3",
            81559,
            "00000000:18:00.0",
            0,
        ),
        (
            1,
            "GPU-5d2b3c1e-0000-4000-8000-000000000001",
            "NVIDIA H100 80GB HBM3",
            81559,
            "00000000:2A:00.0",
            1,
        ),
    ]
    mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    mask |= pynvml.nvmlEventTypeSingleBitEccError
    assert backend.event_mask == mask == 0b1011
    assert fake.registered == {0: mask, 1: mask}
    assert backend.registered_masks == {0: mask, 1: mask}
    assert backend.driver_version == "550.54.15"
    await backend.stop()
    assert fake.freed and fake.shutdown


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "DriverNotLoaded"),
    ],
)
async def test_init_failure_raises_nvml_error_and_is_counted(fake: FakeNvml, code: int, name: str) -> None:
    fake.init_error = code
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    with pytest.raises(NvmlError, match="nvmlInit failed") as info:
        await backend.start()
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    assert info.value.__cause__.value == code
    assert errors.seen == [("nvmlInit", name)]
    await backend.stop()
    assert not fake.shutdown  # never initialised: nothing to shut down


async def test_events_become_device_events_with_the_xid_number(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    await backend.start()
    fake.event(1, pynvml.nvmlEventTypeXidCriticalError, 79)
    fake.event(0, pynvml.nvmlEventTypeDoubleBitEccError)
    fake.event(0, pynvml.nvmlEventTypeSingleBitEccError)
    events = await backend.wait_events(2.5)
    assert [(e.index, e.kind, e.xid) for e in events] == [
        (1, EventKind.XID, 79),
        (0, EventKind.DOUBLE_BIT_ECC, None),
        (0, EventKind.SINGLE_BIT_ECC, None),
    ]
    # the first wait uses the timeout in ms, the drain after an event does not wait
    assert fake.wait_timeouts == [2500, 0, 0, 0]
    fake.wait_timeouts.clear()
    assert await backend.wait_events(0.25) == []
    assert fake.wait_timeouts == [250]
    await backend.stop()


async def test_gpu_lost_during_wait_singles_out_the_lost_gpu(fake: FakeNvml) -> None:
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    await backend.start()
    fake.gpus[1].lost = True
    fake.wait_error = pynvml.NVML_ERROR_GPU_IS_LOST
    events = await backend.wait_events(1.0)
    assert [(e.index, e.kind) for e in events] == [(1, EventKind.LOST)]
    assert ("nvmlEventSetWait_v2", "GpuIsLost") in errors.seen
    await backend.stop()


async def test_gpu_lost_that_no_probe_finds_marks_every_gpu_lost(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    await backend.start()
    fake.wait_error = pynvml.NVML_ERROR_GPU_IS_LOST
    events = await backend.wait_events(1.0)
    assert sorted((e.index, e.kind) for e in events) == [(0, EventKind.LOST), (1, EventKind.LOST)]
    await backend.stop()


async def test_other_wait_errors_raise(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    await backend.start()
    fake.wait_error = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(NvmlError, match="nvmlEventSetWait_v2") as info:
        await backend.wait_events(1.0)
    assert isinstance(info.value.__cause__, pynvml.NVMLError_Unknown)
    await backend.stop()


async def test_query_reads_temperature_and_remapped_rows(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    await backend.start()
    fake.gpus[0].remapped = (3, 0, 1, 0)
    fake.gpus[1].remapped = (0, 2, 0, 1)
    s0, s1 = await backend.query(0), await backend.query(1)
    assert (
        s0.temperature_c,
        s0.remapped_rows_pending,
        s0.remapped_rows_failure,
        s0.retired_pages_pending,
    ) == (
        41,
        True,
        False,
        False,
    )
    assert s0.ok
    assert s1.remapped_rows_failure is True
    assert not s1.ok and s1.problem == "row remapping failed"
    await backend.stop()


async def test_not_supported_is_per_call_and_not_asked_again(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    fake.gpus[0].not_supported = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetMinorNumber"}
    devices = await backend.start()
    assert devices[0].minor_number is None and devices[1].minor_number == 1
    first = await backend.query(0)
    second = await backend.query(0)
    assert first.remapped_rows_pending is None and first.remapped_rows_failure is None
    assert first.temperature_c == 41 and first.ok
    assert second.remapped_rows_pending is None and second.temperature_c == 41
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 1  # the second query skipped it
    assert fake.calls["nvmlDeviceGetTemperature"] == 2
    await backend.stop()


async def test_query_of_a_lost_gpu_reports_lost(fake: FakeNvml) -> None:
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    await backend.start()
    fake.gpus[0].lost = True
    sample = await backend.query(0)
    assert sample.lost and not sample.ok
    assert sample.problem == "GPU is lost (fallen off the bus)"
    assert errors.seen == [("nvmlDeviceGetTemperature", "GpuIsLost")]
    await backend.stop()


async def test_query_error_other_than_lost_raises_and_is_counted(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    await backend.start()

    def broken(handle: Any, sensor: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", broken)
    with pytest.raises(NvmlError, match="nvmlDeviceGetTemperature on GPU 1"):
        await backend.query(1)
    assert errors.seen == [("nvmlDeviceGetTemperature", "Unknown")]
    await backend.stop()


async def test_gpu_lost_at_enumeration_is_reported_lost_not_healthy(fake: FakeNvml) -> None:
    fake.gpus[1].lost = True
    backend = NvmlBackend()
    devices = await backend.start()
    assert devices[1].uuid == "" and devices[1].index == 1
    events = await backend.wait_events(1.0)
    assert [(e.index, e.kind) for e in events] == [(1, EventKind.LOST)]
    assert (await backend.query(1)).lost
    await backend.stop()


async def test_registration_not_supported_keeps_the_gpu_with_queries_only(fake: FakeNvml) -> None:
    fake.register_error[0] = pynvml.NVML_ERROR_NOT_SUPPORTED
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    devices = await backend.start()
    assert len(devices) == 2
    assert fake.registered == {1: backend.event_mask}
    assert errors.seen == [("nvmlDeviceRegisterEvents", "NotSupported")]
    await backend.stop()


async def test_gpu_without_ecc_events_still_registers_xid_events(fake: FakeNvml) -> None:
    fake.gpus[1] = FakeGpu(uuid="GPU-geforce", name="NVIDIA GeForce RTX 4090", minor=1)
    errors = Errors()
    backend = NvmlBackend(on_error=errors)
    await backend.start()
    xid = pynvml.nvmlEventTypeXidCriticalError
    assert fake.registered == {0: backend.event_mask, 1: xid}
    assert errors.seen == []
    fake.event(1, xid, 79)
    events = await backend.wait_events(1.0)
    assert [(e.index, e.kind, e.xid) for e in events] == [(1, EventKind.XID, 79)]
    await backend.stop()


def test_the_fake_refuses_a_mask_with_an_unsupported_type_as_nvml_does(fake: FakeNvml) -> None:
    fake.gpus[0] = FakeGpu(uuid="GPU-geforce", name="NVIDIA GeForce RTX 4090")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    full = pynvml.nvmlEventTypeXidCriticalError | _ECC
    with pytest.raises(pynvml.NVMLError) as info:
        pynvml.nvmlDeviceRegisterEvents(handle, full, pynvml.nvmlEventSetCreate())
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


async def test_gpu_supporting_no_health_event_is_left_to_queries(fake: FakeNvml) -> None:
    fake.gpus[0].events_supported = pynvml.nvmlEventTypePState
    fake.gpus[1].not_supported.add("nvmlDeviceGetSupportedEventTypes")
    backend = NvmlBackend()
    await backend.start()
    assert fake.registered == {} and backend.registered_masks == {}
    assert fake.calls.get("nvmlDeviceRegisterEvents", 0) == 0
    assert (await backend.query(0)).ok
    await backend.stop()


async def test_probe_prints_what_the_backend_sees(fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake.event(0, pynvml.nvmlEventTypeXidCriticalError, 48)
    report = await nvml_mod.probe(wait_seconds=0.1)
    assert report["driverVersion"] == "550.54.15"
    assert [d["uuid"] for d in report["devices"]] == [g.uuid for g in fake.gpus]
    assert [e["xid"] for e in report["events"]] == [48]
    assert report["samples"][0]["temperature_c"] == 41
    assert report["registeredEventMasks"] == {"0": "0xb", "1": "0xb"}
    json.dumps(report)


def test_probe_main_exits_1_when_nvml_cannot_start(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert nvml_mod.main(["--wait", "0"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert "Driver Not Loaded" in out["error"]


def test_probe_main_prints_json(fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert nvml_mod.main(["--wait", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["eventMask"] == "0xb"
    assert len(out["devices"]) == 2
