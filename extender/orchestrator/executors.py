"""How the orchestrator runs a command in a pod's container: the :class:`Executor` Protocol and
two implementations.

- :class:`CriExecutor`: CRI ``RuntimeService/ExecSync`` (``runtime.v1``) over gRPC to the
  container runtime's socket (containerd's CRI plugin), by container id. For an orchestrator
  running on the node, and for the containerd testbed. Messages from :mod:`flexlease.cri`.
- :class:`KubeExecutor`: the Kubernetes ``pods/exec`` subresource over a websocket with the
  ``v4.channel.k8s.io`` subprotocol (kubernetes_asyncio's ``WsApiClient``): one binary frame
  per chunk whose first byte is the channel (1 stdout, 2 stderr, 3 error); the error channel
  carries a ``metav1.Status`` — ``Success``, or ``Failure`` with reason ``NonZeroExitCode``
  and the exit code in ``details.causes[reason=ExitCode].message``.

A command that runs and exits non-zero is a result, not an error; :class:`ExecError` means it
could not be run (runtime or API server unreachable, container gone, timed out).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, Self, runtime_checkable

import aiohttp
import grpc
from kubernetes_asyncio.client import Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from extender.orchestrator.snapshot import PodState
from flexlease.cri import api_pb2
from flexlease.errors import ExecError

log = logging.getLogger(__name__)

_OUTPUT_LIMIT: Final = 64 * 1024
"""Bytes of stdout/stderr kept per execution (the tail is what a log needs)."""

_STDOUT, _STDERR, _ERROR = 1, 2, 3
_EXEC_SYNC: Final = "/runtime.v1.RuntimeService/ExecSync"


@dataclass(frozen=True, slots=True)
class ExecResult:
    """A finished execution: exit code (0 = success) and the last 64 KiB of each stream."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""


@runtime_checkable
class Executor(Protocol):
    """Runs ``argv`` in ``pod``'s command container and waits for it to exit, at most
    ``timeout_seconds``. Returns the exit code and output; raises :class:`ExecError` when the
    command could not be run or did not finish in time."""

    async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult: ...


class CriExecutor:
    """CRI ``ExecSync`` on the container runtime at ``endpoint`` (``unix:///...``).

    ``ExecSyncRequest.timeout`` is whole seconds (rounded up); the gRPC deadline allows
    ``grace_seconds`` more for the runtime to report the timeout itself. Use as an async
    context manager (or call :meth:`close`)."""

    def __init__(self, endpoint: str, *, grace_seconds: float = 5.0) -> None:
        self.endpoint = endpoint
        self._grace = grace_seconds
        self._channel = grpc.aio.insecure_channel(endpoint)
        self._exec_sync = self._channel.unary_unary(
            _EXEC_SYNC,
            request_serializer=api_pb2.ExecSyncRequest.SerializeToString,
            response_deserializer=api_pb2.ExecSyncResponse.FromString,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult:
        if not pod.container_id:
            raise ExecError(f"pod {pod.key}: container {pod.container!r} has no container id yet")
        seconds = max(1, int(-(-timeout_seconds // 1)))
        request = api_pb2.ExecSyncRequest(container_id=pod.container_id, cmd=list(argv), timeout=seconds)
        try:
            response: api_pb2.ExecSyncResponse = await self._exec_sync(request, timeout=seconds + self._grace)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise ExecError(
                f"CRI ExecSync in {pod.key} container {pod.container} ({pod.container_id[:12]}) at "
                f"{self.endpoint}: {code.name}: {exc.details() or ''}"
            ) from exc
        return ExecResult(
            exit_code=response.exit_code,
            stdout=bytes(response.stdout[-_OUTPUT_LIMIT:]),
            stderr=bytes(response.stderr[-_OUTPUT_LIMIT:]),
        )


class KubeExecutor:
    """Kubernetes ``pods/exec`` (``connect_get_namespaced_pod_exec``) through kubernetes_asyncio's
    websocket client, for ``configuration`` (the API server's address and credentials, e.g.
    from :func:`flexlease.store.kube_auth.load_configuration`). Use as an async context manager."""

    def __init__(self, configuration: Configuration) -> None:
        self._client = WsApiClient(configuration=configuration)
        self._api: Any = CoreV1Api(api_client=self._client)  # its stubs type `command` as str

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def exec(self, pod: PodState, argv: Sequence[str], *, timeout_seconds: float) -> ExecResult:
        what = f"exec in {pod.key} container {pod.container}"
        stdout = bytearray()
        stderr = bytearray()
        status: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(timeout_seconds):
                ws_context = await self._api.connect_get_namespaced_pod_exec(
                    pod.name,
                    pod.namespace,
                    command=list(argv),
                    container=pod.container or None,
                    stdin=False,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                )
                async with ws_context as ws:
                    async for message in ws:
                        if message.type is not aiohttp.WSMsgType.BINARY or not message.data:
                            continue
                        channel, data = message.data[0], message.data[1:]
                        if channel == _STDOUT:
                            stdout += data
                            del stdout[:-_OUTPUT_LIMIT]
                        elif channel == _STDERR:
                            stderr += data
                            del stderr[:-_OUTPUT_LIMIT]
                        elif channel == _ERROR and data:
                            status = json.loads(data)
        except TimeoutError as exc:
            raise ExecError(f"{what}: no exit within {timeout_seconds:g} s") from exc
        except aiohttp.WSServerHandshakeError as exc:
            raise ExecError(f"{what}: API server refused the exec: HTTP {exc.status} {exc.message}") from exc
        except (aiohttp.ClientError, ApiException, OSError, ValueError) as exc:
            raise ExecError(f"{what}: {type(exc).__name__}: {exc}") from exc
        if status is None:
            raise ExecError(f"{what}: the stream closed without an exit status")
        return ExecResult(exit_code=exit_code(status, what=what), stdout=bytes(stdout), stderr=bytes(stderr))


def exit_code(status: dict[str, Any], *, what: str = "exec") -> int:
    """The exit code in an exec error-channel ``metav1.Status``: 0 for ``Success``; for
    ``Failure`` with reason ``NonZeroExitCode``, the ``ExitCode`` cause. Any other failure (the
    command could not start, the container vanished) raises :class:`ExecError` with its message."""
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", ""))
                except ValueError:
                    break
    raise ExecError(f"{what}: {status.get('message') or status.get('reason') or 'failed'}")
