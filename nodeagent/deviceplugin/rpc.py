"""Typed gRPC plumbing for the kubelet APIs: method handlers for a server and callables for a
client, built from the generated message classes and the upstream service/method names
(``/v1beta1.Registration/Register``, ``/v1beta1.DevicePlugin/...``,
``/v1.PodResourcesLister/...``). Used instead of the generated ``*_pb2_grpc`` stubs, which are
untyped; the wire is the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import grpc
from google.protobuf.message import Message

REGISTRATION: Final = "v1beta1.Registration"
DEVICE_PLUGIN: Final = "v1beta1.DevicePlugin"
POD_RESOURCES: Final = "v1.PodResourcesLister"

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def unary_handler(
    fn: Callable[[Req, Any], Awaitable[Resp]], request_type: type[Req]
) -> grpc.RpcMethodHandler:
    """A server handler for a unary-unary ``grpc.aio`` method ``fn(request, context)``."""
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request_type.FromString, response_serializer=lambda m: m.SerializeToString()
    )


def stream_handler(
    fn: Callable[[Req, Any], AsyncIterator[Resp]], request_type: type[Req]
) -> grpc.RpcMethodHandler:
    """A server handler for a unary-stream ``grpc.aio`` method (an async generator)."""
    return grpc.unary_stream_rpc_method_handler(
        fn, request_deserializer=request_type.FromString, response_serializer=lambda m: m.SerializeToString()
    )


def service(name: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> grpc.GenericRpcHandler:
    """The generic handler serving ``handlers`` (method name → handler) as service ``name``."""
    return grpc.method_handlers_generic_handler(name, dict(handlers))


def unary_call(
    channel: grpc.aio.Channel, service_name: str, method: str, response_type: type[Resp]
) -> Callable[..., Awaitable[Resp]]:
    """A client callable ``await call(request, timeout=...)`` for ``/<service>/<method>``."""
    call: Callable[..., Awaitable[Resp]] = channel.unary_unary(
        f"/{service_name}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_type.FromString,
    )
    return call


def stream_call(
    channel: grpc.aio.Channel, service_name: str, method: str, response_type: type[Resp]
) -> Callable[..., Any]:
    """A client callable for a server-streaming method: ``call(request)`` iterates responses."""
    return channel.unary_stream(  # type: ignore[no-any-return]
        f"/{service_name}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_type.FromString,
    )
