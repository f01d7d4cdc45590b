"""Kubernetes exec through kubernetes_asyncio's websocket client against a stand-in API server
speaking the ``v4.channel.k8s.io`` exec protocol; the error-channel Status parser."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import Configuration

from extender.orchestrator.executors import ExecResult, Executor, KubeExecutor, exit_code
from extender.orchestrator.snapshot import PodState, pod_state
from flexlease.errors import ExecError
from flexlease.store.base import Kind
from flexlease.store.memory import MemoryStore
from tests.extender.orchestrator import exec_server
from tests.extender.orchestrator.pods import pod


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestServer, MemoryStore]]:
    store = MemoryStore()
    await store.create(Kind.POD, pod("w-0", "worker"))
    server = TestServer(exec_server.create_app(store), host="127.0.0.1")
    await server.start_server()
    yield server, store
    await asyncio.sleep(0.1)  # let a request whose client already gave up arrive
    for _ in range(1000):  # the stand-in kills a command whose client hung up
        if not server.app[exec_server.RUNNING]:
            break
        await asyncio.sleep(0.01)
    await server.close()
    await store.close()


@pytest.fixture
async def executor(api: tuple[TestServer, MemoryStore]) -> AsyncIterator[KubeExecutor]:
    config = Configuration(host=str(api[0].make_url("")).rstrip("/"))
    async with KubeExecutor(config) as ex:
        yield ex


def _target(name: str = "w-0") -> PodState:
    return pod_state(pod(name, "worker"))


async def test_kube_exec_returns_output_and_exit_code(
    executor: KubeExecutor, api: tuple[TestServer, MemoryStore]
) -> None:
    assert isinstance(executor, Executor)
    ok = await executor.exec(_target(), ["sh", "-c", "echo hello; echo warn >&2"], timeout_seconds=10)
    assert ok == ExecResult(0, b"hello\n", b"warn\n")
    failed = await executor.exec(_target(), ["sh", "-c", "echo no >&2; exit 7"], timeout_seconds=10)
    assert (failed.exit_code, failed.stderr) == (7, b"no\n")
    assert api[0].app[exec_server.EXECS][0] == ("w-0", "main", ["sh", "-c", "echo hello; echo warn >&2"])


async def test_kube_exec_errors(executor: KubeExecutor) -> None:
    with pytest.raises(ExecError, match="HTTP 404"):
        await executor.exec(_target("nobody"), ["true"], timeout_seconds=10)
    with pytest.raises(ExecError, match=r"executable file not found|No such file"):
        await executor.exec(_target(), ["/no/such/binary"], timeout_seconds=10)
    with pytest.raises(ExecError, match=r"no exit within 0\.2 s"):
        await executor.exec(_target(), ["sleep", "1"], timeout_seconds=0.2)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"metadata": {}, "status": "Success"}, 0),
        (
            {
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "137"}]},
            },
            137,
        ),
    ],
)
def test_exit_code(status: dict[str, Any], expected: int) -> None:
    assert exit_code(status) == expected


@pytest.mark.parametrize(
    "status",
    [
        {"status": "Failure", "reason": "InternalError", "message": "container not running"},
        {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "x"}]},
        },
        {"status": "Failure", "reason": "NonZeroExitCode"},
        {},
    ],
)
def test_exit_code_rejects(status: dict[str, Any]) -> None:
    with pytest.raises(ExecError):
        exit_code(status)
