"""The simulated backend: node YAML, the event script on an injected clock, injection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pydantic
import pytest
import yaml

from flexlease.clock import ManualClock
from flexlease.errors import NvmlError
from nodeagent.health.backend import DeviceEvent, EventKind
from nodeagent.health.simulated import NodeConfig, SimulatedBackend, load_node_config

NODE_YAML = """
name: sim-a
gpus:
  count: 4
  model: NVIDIA H20
  memoryMiB: 97871
events:
  - {at: 10, gpu: 1, event: xid, xid: 79}
  - {at: 10, gpu: 2, event: xid, xid: 13}
  - {at: 20, gpu: 3, event: lost}
  - {at: 30, gpu: 0, event: dbe}
  - {at: 35, gpu: 0, event: sbe}
  - {at: 50, gpu: 3, event: recovered, temperatureC: 77}
"""


def test_the_shipped_demo_node_file_loads() -> None:
    path = Path(__file__).parents[3] / "nodeagent" / "health" / "sim-node.yaml"
    config = load_node_config(path)
    assert len(config.device_infos()) == 8


def test_node_file_describes_gpus_with_stable_uuids(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(NODE_YAML)
    config = load_node_config(path)
    devices = config.device_infos()
    assert [(d.index, d.model, d.memory_mib, d.minor_number) for d in devices] == [
        (i, "NVIDIA H20", 97871, i) for i in range(4)
    ]
    assert len({d.uuid for d in devices}) == 4
    assert all(d.uuid.startswith("GPU-") for d in devices)
    assert load_node_config(path).device_infos() == devices  # stable across loads


def test_explicit_devices_and_uuids() -> None:
    config = NodeConfig.model_validate(
        {
            "devices": [
                {"uuid": "GPU-a", "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920},
                {"uuid": "GPU-b"},
            ]
        }
    )
    assert [(d.uuid, d.model) for d in config.device_infos()] == [
        ("GPU-a", "NVIDIA A100-SXM4-80GB"),
        ("GPU-b", "NVIDIA H100 80GB HBM3"),
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "exactly one of `gpus` and `devices`"),
        ({"gpus": {"count": 2}, "events": [{"at": 1, "gpu": 2, "event": "lost"}]}, "names GPU 2"),
        ({"gpus": {"count": 1}, "events": [{"at": 1, "gpu": 0, "event": "xid"}]}, "`xid` exactly"),
        ({"gpus": {"count": 2, "uuids": ["GPU-a"]}}, "1 entries for 2 GPUs"),
        ({"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-a"}]}, "unique"),
        ({"gpus": {"count": 1}, "events": [{"at": 1, "gpu": 0, "event": "melt"}]}, "event"),
        (
            {
                "gpus": {"count": 1, "model": "NVIDIA GeForce RTX 4090"},
                "events": [{"at": 1, "gpu": 0, "event": "dbe"}],
            },
            "supports no dbe events",
        ),
        (
            {"devices": [{"uuid": "GPU-a", "ecc": False}], "events": [{"at": 1, "gpu": 0, "event": "sbe"}]},
            "supports no sbe events",
        ),
    ],
)
def test_bad_node_files_are_rejected_clearly(doc: dict[str, object], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        NodeConfig.model_validate(doc)


async def test_script_plays_on_the_clock() -> None:
    clock = ManualClock(start=1000.0)
    config = NodeConfig.model_validate(yaml.safe_load(NODE_YAML))
    backend = SimulatedBackend(config, clock)
    with pytest.raises(NvmlError):
        await backend.wait_events(1)
    await backend.start()
    assert backend.driver_version == "simulated"
    # nothing due yet: the wait sleeps up to the timeout on the clock
    task = asyncio.create_task(backend.wait_events(5), name="test:wait")
    await asyncio.sleep(0)
    assert clock.sleepers == 1
    await clock.advance(5)
    assert await task == []
    await clock.set(1010.0)
    events = await backend.wait_events(5)
    assert [(e.index, e.kind, e.xid, e.at) for e in events] == [
        (1, EventKind.XID, 79, 1010.0),
        (2, EventKind.XID, 13, 1010.0),
    ]
    await clock.set(1020.0)
    # a query before the watch takes the event already sees the GPU lost
    assert (await backend.query(3)).lost
    assert [(e.index, e.kind) for e in await backend.wait_events(1)] == [(3, EventKind.LOST)]
    await clock.set(1040.0)
    kinds = [(e.index, e.kind) for e in await backend.wait_events(1)]
    assert kinds == [(0, EventKind.DOUBLE_BIT_ECC), (0, EventKind.SINGLE_BIT_ECC)]
    assert (await backend.query(3)).lost
    await clock.set(1050.0)
    sample = await backend.query(3)
    assert not sample.lost and sample.ok and sample.temperature_c == 77
    assert (await backend.query(0)).temperature_c == 35
    with pytest.raises(NvmlError, match="no simulated GPU 9"):
        await backend.query(9)
    await backend.stop()


async def test_wait_sleeps_only_until_the_next_script_entry() -> None:
    clock = ManualClock(start=0.0)
    config = NodeConfig.model_validate(
        {"gpus": {"count": 1}, "events": [{"at": 3, "gpu": 0, "event": "lost"}]}
    )
    backend = SimulatedBackend(config, clock)
    await backend.start()
    task = asyncio.create_task(backend.wait_events(60), name="test:wait")
    await asyncio.sleep(0)
    await clock.advance(2.9)
    assert not task.done()
    await clock.advance(0.1)
    assert [(e.kind, e.at) for e in await task] == [(EventKind.LOST, 3.0)]


async def test_injected_events_and_recovery() -> None:
    clock = ManualClock(start=0.0)
    backend = SimulatedBackend(NodeConfig.model_validate({"gpus": {"count": 2}}), clock)
    await backend.start()
    backend.inject(DeviceEvent(index=1, kind=EventKind.LOST, at=0.0))
    assert (await backend.query(1)).lost
    assert [e.kind for e in await backend.wait_events(1)] == [EventKind.LOST]
    backend.recover(1)
    assert (await backend.query(1)).ok


async def test_nvml_init_failure_is_simulated() -> None:
    config = NodeConfig.model_validate({"gpus": {"count": 2}, "nvmlInitFails": True})
    with pytest.raises(NvmlError, match="nvmlInit failed"):
        await SimulatedBackend(config, ManualClock()).start()


async def test_a_gpu_without_ecc_delivers_xid_but_refuses_ecc_events() -> None:
    clock = ManualClock(start=0.0)
    config = NodeConfig.model_validate(
        {
            "devices": [{"uuid": "GPU-h"}, {"uuid": "GPU-g", "model": "NVIDIA GeForce RTX 4090"}],
            "events": [{"at": 1, "gpu": 1, "event": "xid", "xid": 79}],
        }
    )
    backend = SimulatedBackend(config, clock)
    await backend.start()
    assert backend.supported_events(0) == frozenset(EventKind)
    assert backend.supported_events(1) == {EventKind.XID, EventKind.LOST}
    with pytest.raises(ValueError, match="supports no dbe events"):
        backend.inject(DeviceEvent(index=1, kind=EventKind.DOUBLE_BIT_ECC, at=0.0))
    await clock.advance(1)
    assert [(e.index, e.xid) for e in await backend.wait_events(0)] == [(1, 79)]
