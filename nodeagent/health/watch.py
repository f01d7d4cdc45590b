"""The health watch: the agent component that drives the GPU backend.

It starts NVML (retrying every ``heartbeat_seconds`` while it fails — all GPUs ``Unknown``
meanwhile, logged at error level, ``flexlease_nvml_up`` 0), then loops: query every GPU each
``poll_seconds`` and, in between, wait on the NVML event set. Events and samples go through
the :class:`~nodeagent.health.policy.HealthPolicy` into the
:class:`~nodeagent.health.board.NodeBoard`, which records transitions in the ledger; the tier
is re-evaluated after each batch so a failure downgrades at once. Three failed rounds in a
row (an NVML error other than a lost GPU) mark every GPU ``Unknown`` until NVML answers again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from flexlease.errors import NvmlError
from flexlease.logging import ctx as logctx
from nodeagent.health.backend import EventKind

if TYPE_CHECKING:
    from nodeagent.context import AgentContext

log = logging.getLogger(__name__)

FAILED_ROUNDS_BEFORE_DOWN: Final = 3


class HealthWatch:
    """Agent component ``health``. Ready once NVML has been tried (up or reported down)."""

    name = "health"

    def __init__(self) -> None:
        self._tried = False

    def ready(self) -> bool:
        return self._tried

    async def run(self, ctx: AgentContext) -> None:
        """Run until cancelled; stops the backend on the way out."""
        try:
            await self._start(ctx)
            await self._watch(ctx)
        finally:
            await ctx.backend.stop()

    async def _start(self, ctx: AgentContext) -> None:
        board, clock = ctx.board, ctx.clock
        last_error: str | None = None
        while True:
            try:
                devices = await ctx.backend.start()
            except NvmlError as exc:
                reason = f"NVML unavailable: {exc}"
                if reason != last_error:
                    log.error(
                        "NVML failed to initialise; every GPU is reported Unknown",
                        extra=logctx(
                            node=board.node,
                            error=str(exc),
                            retry_seconds=ctx.settings.agent.heartbeat_seconds,
                        ),
                    )
                    last_error = reason
                board.set_backend_down(reason, clock.now())
                board.retier(clock.now())
                self._tried = True
                await ctx.backend.stop()
                await clock.sleep(ctx.settings.agent.heartbeat_seconds)
                continue
            board.driver_version = ctx.backend.driver_version
            board.set_devices(devices, clock.now())
            if last_error is not None:
                log.info("NVML initialised after failing", extra=logctx(node=board.node, gpus=len(devices)))
            else:
                log.info("NVML initialised", extra=logctx(node=board.node, gpus=len(devices)))
            self._tried = True
            return

    async def _watch(self, ctx: AgentContext) -> None:
        board, clock, backend = ctx.board, ctx.clock, ctx.backend
        poll = ctx.settings.agent.poll_seconds
        failed_rounds = 0
        next_poll = clock.now()
        while True:
            try:
                if clock.now() >= next_poll:
                    for index in sorted(board.devices):
                        board.apply_sample(await backend.query(index))
                    next_poll = clock.now() + poll
                    board.retier(clock.now())
                events = await backend.wait_events(max(0.0, next_poll - clock.now()))
            except NvmlError as exc:
                failed_rounds += 1
                log.warning(
                    "NVML query failed",
                    extra=logctx(node=board.node, error=str(exc), failed_rounds=failed_rounds),
                )
                if failed_rounds >= FAILED_ROUNDS_BEFORE_DOWN:
                    board.set_backend_down(f"NVML failing: {exc}", clock.now())
                    board.retier(clock.now())
                next_poll = clock.now() + poll
                await clock.sleep(poll)
                continue
            if failed_rounds:
                failed_rounds = 0
                board.set_backend_answering()
            for event in events:
                if event.kind is EventKind.XID and event.xid is not None and event.index in board.devices:
                    ident = board.devices[event.index]
                    ctx.metrics.xid(gpu=event.index, uuid=ident.uuid, model=ident.model, xid=event.xid)
                    log.info("XID event", extra=logctx(node=board.node, gpu=event.index, xid=event.xid))
                board.apply_event(event)
            if events:
                board.retier(clock.now())
