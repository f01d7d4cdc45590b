"""A stand-in Kubernetes API server for ``pods/exec`` only, speaking the real wire protocol:
``GET /api/v1/namespaces/{ns}/pods/{name}/exec?command=..&container=..&stdout=true&stderr=true``
upgraded to a websocket with subprotocol ``v4.channel.k8s.io``; binary frames prefixed with the
channel byte (1 stdout, 2 stderr, 3 error); the error channel carries the ``metav1.Status`` that
kubelet's remotecommand server writes (``Success``; ``Failure``/``NonZeroExitCode`` with an
``ExitCode`` cause; ``Failure``/``InternalError`` when the command cannot start). Errors before
the upgrade are ``metav1.Status`` JSON with the HTTP code (404 pod not found, 400 bad request).

The command runs as a local subprocess (a real process with a real exit code), standing in for
the container runtime; pods are looked up in a store, so unknown pods get the API's 404.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from flexlease.errors import NotFound
from flexlease.store.base import Kind, Store

PROTOCOL = "v4.channel.k8s.io"
STORE = web.AppKey("store", Store)
EXECS = web.AppKey("execs", list)
RUNNING = web.AppKey("running", set)
"""Exec requests being served (a test waits for this to empty before it ends)."""


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


async def _exec(request: web.Request) -> web.StreamResponse:
    task = asyncio.current_task()
    request.app[RUNNING].add(task)
    try:
        return await _serve(request)
    finally:
        request.app[RUNNING].discard(task)


async def _serve(request: web.Request) -> web.StreamResponse:
    ns, name = request.match_info["namespace"], request.match_info["name"]
    argv = request.query.getall("command", [])
    container = request.query.get("container")
    try:
        pod = await request.app[STORE].get(Kind.POD, name, namespace=ns)
    except NotFound:
        return _status(404, "NotFound", f'pods "{name}" not found')
    names = [c.get("name") for c in pod.get("spec", {}).get("containers", [])]
    if container is not None and container not in names:
        return _status(400, "BadRequest", f"container {container} is not valid for pod {name}")
    if not argv:
        return _status(400, "BadRequest", "you must specify at least 1 command")
    if PROTOCOL not in request.headers.get("Sec-WebSocket-Protocol", ""):
        return _status(400, "BadRequest", "unable to upgrade connection: no supported subprotocol")
    request.app[EXECS].append((name, container, argv))
    ws = web.WebSocketResponse(protocols=(PROTOCOL,))
    await ws.prepare(request)
    status: dict[str, Any]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        status = {
            "metadata": {},
            "status": "Failure",
            "message": f"Internal error occurred: error executing command in container: {exc}",
            "reason": "InternalError",
            "details": {"causes": [{"message": str(exc)}]},
            "code": 500,
        }
    else:
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # aiohttp cancels the handler when the client hangs up
            proc.kill()
            await proc.communicate()
            raise
        if ws.closed:
            return ws
        if out:
            await ws.send_bytes(b"\x01" + out)
        if err:
            await ws.send_bytes(b"\x02" + err)
        rc = proc.returncode or 0
        if rc == 0:
            status = {"metadata": {}, "status": "Success"}
        else:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {rc}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]},
            }
    await ws.send_bytes(b"\x03" + json.dumps(status).encode())
    await ws.close()
    return ws


def create_app(store: Store) -> web.Application:
    app = web.Application()
    app[STORE] = store
    app[EXECS] = []
    app[RUNNING] = set()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}/exec", _exec)
    app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/exec", _exec)
    return app
