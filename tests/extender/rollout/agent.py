"""A simulated node agent for rollout tests: it answers ``flexlease.io/hot-restart`` requests
through the store as the real agent's ``kubelet`` strategy does — ``InProgress`` first, then the
pod spec's image patched and a final ``Succeeded`` (or ``Failed``) status with the same id and
camelCase fields (:mod:`nodeagent.hotrestart.model`). ``gated``: each restart finishes only when
the test calls :meth:`SimAgent.finish`, so a test sees exactly what is in flight."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from flexlease.api import keys
from flexlease.errors import NotFound
from flexlease.store.base import EventType, Kind, Store


class SimAgent:
    def __init__(self, store: Store, *, gated: bool = False, fail: dict[str, str] | None = None) -> None:
        self._store = store
        self._gated = gated
        self._fail = fail or {}
        self.pending: list[tuple[str, str, dict[str, Any]]] = []
        """(namespace, pod, request) started and not finished, in arrival order."""
        self.requests: list[tuple[str, dict[str, Any]]] = []
        """(pod, request) in the order the agent saw them."""
        self._wake = asyncio.Event()

    async def run(self) -> None:
        listed = await self._store.list(Kind.POD)
        for pod in listed.items:
            await self._seen(pod)
        async for event in self._store.watch(Kind.POD, resource_version=listed.resource_version):
            if event.type in (EventType.ADDED, EventType.MODIFIED):
                await self._seen(event.object)

    async def _seen(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        raw = annotations.get(keys.ANN_HOT_RESTART)
        if raw is None:
            return
        request = json.loads(raw)
        status = json.loads(annotations.get(keys.ANN_HOT_RESTART_STATUS) or "{}")
        if status.get("id") == request["id"]:
            return
        namespace, name = meta["namespace"], meta["name"]
        self.requests.append((name, request))
        await self._status(namespace, name, request, "InProgress")
        self.pending.append((namespace, name, request))
        if not self._gated:
            await self.finish()

    async def finish(self, count: int = 1) -> list[str]:
        """Finish the ``count`` oldest pending restarts; returns their pods."""
        done: list[str] = []
        for _ in range(count):
            namespace, name, request = self.pending.pop(0)
            message = self._fail.get(name)
            try:
                if message is None:
                    pod = await self._store.get(Kind.POD, name, namespace=namespace)
                    containers = [
                        {**c, "image": request["image"]} if c["name"] == request["container"] else c
                        for c in pod["spec"]["containers"]
                    ]
                    await self._store.patch(
                        Kind.POD, name, {"spec": {"containers": containers}}, namespace=namespace
                    )
                await self._status(namespace, name, request, "Failed" if message else "Succeeded", message)
            except NotFound:
                pass  # the pod went away meanwhile
            done.append(name)
        return done

    async def _status(
        self, namespace: str, name: str, request: dict[str, Any], phase: str, message: str | None = None
    ) -> None:
        status: dict[str, Any] = {
            "id": request["id"],
            "phase": phase,
            "strategy": "kubelet",
            "container": request["container"],
            "image": request["image"],
        }
        if phase == "Succeeded":
            status.update(totalSeconds=0.25, pauseSeconds=0.125)
        if message is not None:
            status["message"] = message
        patch = {"metadata": {"annotations": {keys.ANN_HOT_RESTART_STATUS: json.dumps(status)}}}
        await self._store.patch(Kind.POD, name, patch, namespace=namespace)
