"""WeFlex Table 1 in miniature on the real containerd testbed: launch commands fired naively fail
for MPI and Ray when the pods they need are still booting, and succeed through the orchestrator;
TensorFlow's start script waits for its peers itself, so both succeed."""

from __future__ import annotations

import pytest

from extender.orchestrator.executors import CriExecutor
from flexlease.store.memory import MemoryStore
from hack import table1
from nodeagent.cri.client import GrpcCri
from tests.nodeagent.conftest import ContainerdTestbed

SLOW = 3.0
"""Boot delay of the pods a launch depends on: long enough that a launch fired right away
always finds them down, however slowly the containers start."""


@pytest.fixture(scope="module")
def testbed(containerd_testbed: ContainerdTestbed) -> table1.Testbed:
    """The testbed with the framework stand-in image loaded."""
    return table1.prepare(containerd_testbed.dir)


@pytest.mark.parametrize(
    ("framework", "delays", "naive_ok"),
    [
        ("mpi", {"coordinator": [0.0], "worker": [SLOW, SLOW]}, False),
        ("ray", {"head": [SLOW], "worker": [0.0, 0.0]}, False),
        ("tensorflow", {"chief": [0.0], "worker": [1.0, 0.0]}, True),
    ],
)
async def test_naive_versus_orchestrated_launch(
    testbed: table1.Testbed, framework: str, delays: dict[str, list[float]], naive_ok: bool
) -> None:
    prof = table1.profiles()[framework]
    store = MemoryStore()
    try:
        async with (
            GrpcCri(testbed.endpoint, timeout_seconds=30) as cri,
            CriExecutor(testbed.endpoint) as executor,
        ):
            naive = await table1.run_trial(
                cri, testbed, store, executor, prof=prof, mode="naive", index=0, delays=delays
            )
            orchestrated = await table1.run_trial(
                cri, testbed, store, executor, prof=prof, mode="orchestrated", index=1, delays=delays
            )
    finally:
        await store.close()
    assert naive.ok is naive_ok, naive.message
    if not naive_ok:
        assert {"mpi": "ORTE was unable", "ray": "could not connect to the GCS"}[framework] in naive.message
    assert orchestrated.ok, orchestrated.message
    table = table1.format_table([naive, orchestrated])
    assert framework in table and ("1/1 (100 %)" in table) is (not naive_ok)
