"""The status reporter: writes this node's ``GPUNode.status`` through the store.

DESIGN §2: ``status`` is written only by the node's agent; ``spec`` never by it. The reporter
creates the ``GPUNode`` (empty ``spec``) when absent, then keeps ``status.nodeIP``,
``status.agent`` and ``status.devices`` equal to the agent's picture with JSON merge patches
on the ``status`` subresource, each with a resourceVersion precondition: on ``Conflict`` it
re-reads and retries (after OpenKruise's RetryOnConflict). ``status.cache`` belongs to the
cache component and is never touched here.

It writes only when something shown changed (a GPU's health, reason, tier, last XID or
identity, the node IP, the agent version) or the heartbeat (``heartbeat_seconds``) is due;
availability figures move every second, so they are refreshed by the heartbeat write only.
It wakes on :attr:`NodeBoard.changed` and at least every ``poll_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from flexlease import tasks
from flexlease.api import keys
from flexlease.api.resources import AgentInfo, DeviceStatus, GPUNodeSpec, Health, Pool, summarize
from flexlease.api.tiers import Tier
from flexlease.errors import Conflict, NotFound, StoreError
from flexlease.logging import ctx as logctx
from flexlease.store.base import JsonObj, Kind, Store
from nodeagent.health.board import NodeBoard

if TYPE_CHECKING:
    from nodeagent.context import AgentContext

log = logging.getLogger(__name__)

OWNED_KEYS: Final = ("nodeIP", "agent", "devices", "summary")
"""The ``status`` keys this reporter owns; anything else in ``status`` is left alone."""
MAX_CONFLICT_RETRIES: Final = 5


def agent_version() -> str:
    """The installed flexlease version (``0.0.0+unknown`` when not installed)."""
    try:
        return metadata.version("flexlease")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def device_statuses(board: NodeBoard) -> dict[str, DeviceStatus]:
    """``status.devices`` for ``board``. A GPU without a computed tier yet reports LA with no
    ``tierComputedAt`` (the most conservative tier)."""
    out: dict[str, DeviceStatus] = {}
    for index, ident in sorted(board.devices.items()):
        health = board.health.get(index)
        view = board.tiers.get(index)
        out[str(index)] = DeviceStatus(
            uuid=ident.uuid,
            model=ident.model,
            memory_mib=ident.memory_mib,
            health=health.health if health is not None else Health.UNKNOWN,
            reason=health.reason if health is not None else "not yet queried",
            availability=view.availability if view is not None else None,
            tier=view.tier if view is not None else Tier.LA,
            tier_computed_at=_ts(view.tier_computed_at) if view is not None else None,
            last_xid=health.last_xid if health is not None else None,
            minor_number=ident.minor_number,
            pci_bus_id=ident.pci_bus_id,
        )
    return out


def desired_status(board: NodeBoard, *, node_ip: str, version: str, heartbeat: float) -> JsonObj:
    """The owned part of ``status`` (camelCase JSON, ``None`` fields omitted)."""
    out: JsonObj = {
        "agent": AgentInfo(version=version, heartbeat=_ts(heartbeat)).to_json_obj(),
        "devices": {i: d.to_json_obj() for i, d in device_statuses(board).items()},
    }
    if node_ip:
        out["nodeIP"] = node_ip
    return out


def significant(status: JsonObj) -> Any:
    """What decides whether a write is needed: ``status`` without the heartbeat and without
    the availability figures (which the heartbeat write refreshes)."""
    devices = {
        i: {k: v for k, v in dev.items() if k != "availability"}
        for i, dev in status.get("devices", {}).items()
    }
    return {"nodeIP": status.get("nodeIP"), "version": status["agent"]["version"], "devices": devices}


def merge_diff(current: Any, desired: Any) -> Any:
    """The RFC 7386 merge patch that turns ``current`` into ``desired`` (both JSON values):
    changed or new members are set, members missing from ``desired`` are ``null``; nested
    objects are diffed recursively. Returns ``{}`` when equal objects."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
        elif current[key] != value:
            patch[key] = merge_diff(current[key], value)
    for key in current.keys() - desired.keys():
        patch[key] = None
    return patch


def with_summary(desired: JsonObj, current: JsonObj) -> JsonObj:
    """``desired`` plus ``summary``: the printer-column counts of
    :func:`flexlease.api.resources.summarize` over these devices and the GPUNode's current
    ``spec`` (tier overrides, ownership tags; refreshed at least every heartbeat)."""
    try:
        spec = GPUNodeSpec.model_validate(current.get("spec") or {})
    except ValidationError as exc:  # an operator's typo in spec must not stop the agent
        log.warning(
            "GPUNode spec is malformed; summary ignores its overrides and tags",
            extra=logctx(node=(current.get("metadata") or {}).get("name"), error=str(exc)),
        )
        spec = GPUNodeSpec()
    devices = {i: DeviceStatus.model_validate(d) for i, d in desired.get("devices", {}).items()}
    return {**desired, "summary": summarize(spec, devices).to_json_obj()}


def status_patch(current_status: JsonObj, desired: JsonObj) -> JsonObj:
    """The merge patch for the owned keys of ``status`` only."""
    owned_current = {k: current_status[k] for k in OWNED_KEYS if k in current_status}
    diff = merge_diff(owned_current, desired)
    return diff if isinstance(diff, dict) else {}


class StatusReporter:
    """Agent component ``status``. Ready after the first successful write."""

    name = "status"

    def __init__(self) -> None:
        self._written = False
        self._last: Any = None
        self._last_write = float("-inf")
        self._version = agent_version()

    def ready(self) -> bool:
        return self._written

    async def run(self, ctx: AgentContext) -> None:
        """Run until cancelled. Store failures are logged and retried at the next wake-up;
        they never stop the agent."""
        s = ctx.settings.agent
        while True:
            ctx.board.changed.clear()
            try:
                await self.sync(ctx)
            except StoreError as exc:
                ctx.metrics.status_writes.labels(node=ctx.board.node, result="error").inc()
                log.warning(
                    "GPUNode status write failed; retrying",
                    extra=logctx(node=ctx.board.node, error=str(exc), error_type=type(exc).__name__),
                )
            due = self._last_write + s.heartbeat_seconds - ctx.clock.now()
            await _sleep_or_set(ctx, min(s.poll_seconds, max(0.0, due)), event=ctx.board.changed)

    async def sync(self, ctx: AgentContext) -> bool:
        """Write the status when it changed or the heartbeat is due; returns whether it wrote.
        Raises ``StoreError`` (after ``MAX_CONFLICT_RETRIES`` conflicts: ``Conflict``)."""
        now = ctx.clock.now()
        desired = desired_status(
            ctx.board, node_ip=ctx.settings.agent.node_ip, version=self._version, heartbeat=now
        )
        sig = significant(desired)
        if sig == self._last and now - self._last_write < ctx.settings.agent.heartbeat_seconds:
            return False
        await self._write(ctx, desired)
        self._last, self._last_write, self._written = sig, now, True
        ctx.metrics.heartbeat.labels(node=ctx.board.node).set(now)
        ctx.metrics.status_writes.labels(node=ctx.board.node, result="ok").inc()
        return True

    async def _write(self, ctx: AgentContext, desired: JsonObj) -> None:
        store, node = ctx.store, ctx.board.node
        for attempt in range(1, MAX_CONFLICT_RETRIES + 1):
            current = await _get_or_create(store, node)
            patch = status_patch(current.get("status") or {}, with_summary(desired, current))
            if not patch:
                return
            try:
                await store.patch(
                    Kind.GPUNODE,
                    node,
                    {"status": patch},
                    subresource="status",
                    resource_version=current["metadata"]["resourceVersion"],
                )
                return
            except (Conflict, NotFound) as exc:
                ctx.metrics.status_writes.labels(node=node, result="conflict").inc()
                if attempt == MAX_CONFLICT_RETRIES:
                    raise Conflict(f"GPUNode {node}: status write lost {attempt} races in a row") from exc
                log.debug("GPUNode changed under the status write; re-reading", extra=logctx(node=node))


async def _get_or_create(store: Store, node: str) -> JsonObj:
    """The node's ``GPUNode``, created when absent with ``spec.pool: general`` (the default
    pool; the lease controller or an operator moves nodes to ``standby``) and no device tags."""
    try:
        return await store.get(Kind.GPUNODE, node)
    except NotFound:
        pass
    obj: JsonObj = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUNODE_KIND,
        "metadata": {"name": node},
        "spec": {"pool": Pool.GENERAL.value},
    }
    try:
        created = await store.create(Kind.GPUNODE, obj)
    except Conflict:
        return await store.get(Kind.GPUNODE, node)
    log.info("created GPUNode", extra=logctx(node=node))
    return created


async def _sleep_or_set(ctx: AgentContext, seconds: float, *, event: asyncio.Event) -> None:
    """Return after ``seconds`` on the agent's clock or as soon as ``event`` is set."""
    if event.is_set():
        return
    sleeper = asyncio.create_task(ctx.clock.sleep(seconds), name="status:sleep")
    waiter = asyncio.create_task(event.wait(), name="status:changed")
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await tasks.stop(sleeper, waiter)
