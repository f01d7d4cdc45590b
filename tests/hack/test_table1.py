"""The trial schedule both Table 1 harnesses share (``hack.table1.run_schedule``), run with a
recording trial against a CRI server that answers only ``Version`` (the schedule opens the
client; the trials here make no CRI call)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from extender.orchestrator.executors import CriExecutor
from extender.orchestrator.profile import Profile
from flexlease.cri import api_pb2, api_pb2_grpc
from flexlease.store.memory import MemoryStore
from hack import table1
from nodeagent.cri.client import GrpcCri


class _VersionOnly(api_pb2_grpc.RuntimeServiceServicer):
    async def Version(self, request: api_pb2.VersionRequest, context: object) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(
            version="0.1.0", runtime_name="stand-in", runtime_version="0", runtime_api_version="v1"
        )


@dataclass(frozen=True)
class _Bed:
    endpoint: str


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[_Bed]:
    server = grpc.aio.server()
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(_VersionOnly(), server)
    endpoint = f"unix://{tmp_path}/cri.sock"
    server.add_insecure_port(endpoint)
    await server.start()
    try:
        yield _Bed(endpoint)
    finally:
        await server.stop(grace=None)


@dataclass(frozen=True)
class _Ran:
    framework: str
    mode: str
    index: int
    delays: dict[str, list[float]]
    store: MemoryStore


async def _record(
    cri: GrpcCri,
    testbed: _Bed,
    store: MemoryStore,
    executor: CriExecutor,
    *,
    prof: Profile,
    mode: str,
    index: int,
    delays: dict[str, list[float]],
) -> _Ran:
    assert executor.endpoint == testbed.endpoint
    return _Ran(prof.name, mode, index, delays, store)


async def test_each_draw_of_delays_serves_both_modes_in_order(
    bed: _Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = await table1.run_schedule(
        _record,
        bed,
        profiles=table1.profiles(),
        frameworks=("ray", "mpi"),
        workers={"ray": 2, "mpi": 3},
        trials=2,
        seed=5,
        low=0.5,
        high=2.0,
        cri_timeout_seconds=5,
        line=lambda r: f"{r.framework} {r.mode}",
    )

    assert [(r.framework, r.mode, r.index) for r in ran] == [
        ("ray", "naive", 0),
        ("ray", "orchestrated", 1),
        ("mpi", "naive", 2),
        ("mpi", "orchestrated", 3),
        ("ray", "naive", 4),
        ("ray", "orchestrated", 5),
        ("mpi", "naive", 6),
        ("mpi", "orchestrated", 7),
    ]
    rng = random.Random(5)  # same seed, same delays: one draw per framework and round
    drawn = [
        table1.boot_delays(rng, name, n, 0.5, 2.0) for _ in range(2) for name, n in (("ray", 2), ("mpi", 3))
    ]
    assert [r.delays for r in ran[::2]] == drawn
    assert all(a.delays is b.delays for a, b in zip(ran[::2], ran[1::2], strict=True))
    assert len({id(r.store) for r in ran}) == 1
    assert capsys.readouterr().err.splitlines() == [
        "trial 1/2 ray naive",
        "trial 1/2 ray orchestrated",
        "trial 1/2 mpi naive",
        "trial 1/2 mpi orchestrated",
        "trial 2/2 ray naive",
        "trial 2/2 ray orchestrated",
        "trial 2/2 mpi naive",
        "trial 2/2 mpi orchestrated",
    ]


async def test_no_progress_lines_without_line(bed: _Bed, capsys: pytest.CaptureFixture[str]) -> None:
    ran = await table1.run_schedule(
        _record,
        bed,
        profiles=table1.profiles(),
        frameworks=("tensorflow",),
        workers={"tensorflow": 1},
        trials=1,
        seed=1,
        low=0.0,
        high=0.0,
        cri_timeout_seconds=5,
        line=None,
    )
    assert [(r.mode, r.delays) for r in ran] == [
        ("naive", {"chief": [0.0], "worker": [0.0]}),
        ("orchestrated", {"chief": [0.0], "worker": [0.0]}),
    ]
    assert capsys.readouterr().err == ""
