"""The ledger keeper: the agent component that advances the availability ledger, refreshes
tiers and writes the ledger file every ``poll_seconds`` (a crash loses at most that much,
which comes back as unknown time), plus once more when the agent stops.

Encoding and writing go through ``asyncio.to_thread`` (JSON of frozen values, fsync); a
two-week ledger of a GPU flapping every five minutes is about 300 KiB per GPU. A failed write
is logged at error level and retried at the next tick; the previous file stays whole (atomic
rename).

**Stopping.** Cancelling the keeper does not stop a periodic write already running in its
worker thread. The final write therefore goes through the same :class:`LedgerFile`, whose
writes take one lock per file: it waits for the write in flight, then replaces it with the
newer content (each write has its own temp file, so neither can corrupt the other). Should
the final write win the lock first, the periodic one, older by its ``writtenAt``, is skipped
instead of putting older content back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from flexlease.logging import ctx as logctx
from nodeagent import ledger

if TYPE_CHECKING:
    from nodeagent.context import AgentContext

log = logging.getLogger(__name__)


class LedgerKeeper:
    """Agent component ``ledger``. Ready after the first successful write."""

    name = "ledger"

    def __init__(self) -> None:
        self._written = False

    def ready(self) -> bool:
        return self._written

    async def run(self, ctx: AgentContext) -> None:
        """Run until cancelled; writes the ledger one last time when cancelled."""
        try:
            while True:
                await self._write(ctx)
                await ctx.clock.sleep(ctx.settings.agent.poll_seconds)
        except asyncio.CancelledError:
            self._final_write(ctx)
            raise

    async def _write(self, ctx: AgentContext) -> None:
        now = ctx.clock.now()
        ctx.board.retier(now)
        book = ctx.board.ledger
        snapshot = book.snapshot(now)
        try:
            await asyncio.to_thread(self._encode_and_save, ctx, snapshot, now=now)
        except OSError as exc:
            log.error(
                "availability ledger write failed; retrying at the next tick",
                extra=logctx(node=ctx.board.node, path=str(ctx.ledger_file.path), error=str(exc)),
            )
            return
        self._written = True

    @staticmethod
    def _encode_and_save(ctx: AgentContext, snapshot: dict[int, ledger.DeviceLedger], *, now: float) -> None:
        """Worker thread: JSON-encode the snapshot (frozen values) and write it atomically."""
        ctx.ledger_file.save(ledger.encode(ctx.board.node, snapshot, written_at=now), written_at=now)

    def _final_write(self, ctx: AgentContext) -> None:
        """Synchronous, so that a second cancellation cannot interrupt it: runs while the task
        is being cancelled, after the write in flight (the file's lock; a small file, one
        fsync)."""
        now = ctx.clock.now()
        try:
            ctx.ledger_file.save(ctx.board.ledger.encode(now), written_at=now)
        except OSError as exc:
            log.error(
                "final availability ledger write failed; the time since the last write will count as unknown",
                extra=logctx(node=ctx.board.node, error=str(exc)),
            )
