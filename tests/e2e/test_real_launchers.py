"""The real launchers on the real containerd testbed (issue #14): Open MPI's mpirun with mpi4py
ranks, and Ray's ray start, fired naively by the platform while pods they need are not up
fail with the frameworks' own errors; through the orchestrator they succeed (mpirun's ranks
allreduce across the worker pods; every Ray node joins and a task runs)."""

from __future__ import annotations

import pytest

from extender.orchestrator.executors import CriExecutor
from flexlease.store.memory import MemoryStore
from hack import real_launchers
from nodeagent.cri.client import GrpcCri
from tests.nodeagent.conftest import ContainerdTestbed


@pytest.fixture(scope="module")
def testbed(containerd_testbed: ContainerdTestbed) -> real_launchers.Testbed:
    """The testbed with the launcher image loaded."""
    return real_launchers.prepare(containerd_testbed.dir)


@pytest.mark.parametrize(
    ("framework", "delays", "failure"),
    [
        # mpirun starts as soon as the coordinator runs; worker-1's container starts 6 s later,
        # so the rsh agent finds no running task there and ORTE gives up.
        ("mpi", {"coordinator": [0.0], "worker": [1.0, 6.0]}, "ORTE was unable to reliably start"),
        # the worker's ray start runs at once and spends its GCS budget (one attempt, after
        # Ray's import) before the head's container, 10 s later, has its GCS up.
        ("ray", {"head": [10.0], "worker": [0.0]}, "Failed to connect to GCS"),
    ],
)
async def test_naive_launch_fails_and_orchestrated_succeeds(
    testbed: real_launchers.Testbed, framework: str, delays: dict[str, list[float]], failure: str
) -> None:
    prof = real_launchers.profiles()[framework]
    store = MemoryStore()
    try:
        async with (
            GrpcCri(testbed.endpoint, timeout_seconds=60) as cri,
            CriExecutor(testbed.endpoint) as executor,
        ):
            naive = await real_launchers.run_trial(
                cri, testbed, store, executor, prof=prof, mode="naive", index=0, delays=delays
            )
            orchestrated = await real_launchers.run_trial(
                cri, testbed, store, executor, prof=prof, mode="orchestrated", index=1, delays=delays
            )
    finally:
        await store.close()
    assert not naive.ok and failure in naive.message, naive.message
    assert orchestrated.ok, orchestrated.message
    if framework == "ray":
        assert "ray nodes alive: 2/2" in orchestrated.message  # the driver's report
    table = real_launchers.format_table([naive, orchestrated])
    assert "1/1 (100 %)" in table and "0/1 (0 %)" in table
