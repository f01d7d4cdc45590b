"""Garbage-collector policy for the extender's long-lived inventory.

Role: the inventory built by the initial list (at the paper's scale 1,250 GPUNodes, 10,000
devices, 5,000 pods, their node views and memos: millions of objects) lives as long as the
process, yet CPython's cyclic collector re-traverses all of it in every full (generation 2)
collection: hundreds of milliseconds at 1,250 nodes, a pause every scheduling cycle in the
cluster waits for. Once Pods and GPUNodes are listed, :func:`freeze` collects once and moves
every object then alive to the permanent generation (:func:`gc.freeze`, which CPython's
documentation recommends for long-lived state), so later collections traverse only what
changed since; it raises the generation-0 threshold (:data:`GEN0_THRESHOLD`) so that the
young collections run a third as often, and lowers the generation-1 one
(:data:`GEN1_THRESHOLD`) so that each generation-1 pass has fewer survivors to traverse. Objects
frozen and later dropped are still freed by reference counting; only reference cycles among
them would stay (the inventory creates none).

The inventory does not stay as listed: every bind, deletion and GPUNode change replaces
node views, devices and holders, and what replaces them survives the young collections into
generation 2. A generation-1 collection moves its survivors there, and CPython runs a full
collection once ten of those have run and the objects promoted since the last one exceed a
quarter of those it kept then: after a few thousand scheduling cycles a full collection
traverses everything replaced since the freeze (83-96 ms at 2,500 nodes after 3,300 cycles,
``hack/bench_extender.py --nodes 2500 --pods 10000 --cycles 4000``), and the longer the
extender runs, the more of the inventory that is. So :func:`freeze` also installs
:func:`freeze_survivors`, which freezes the survivors of every generation-1 and full
collection as it ends: generation 2 stays empty and a full collection costs what a
generation-1 one does. What this gives up: a reference cycle formed later among objects that
had survived a generation-1 collection is never collected (cycles among young objects still
are, by the young collections). In that run every collection, the full one included, found
no garbage at all (``collected`` 0 in each ``gc.callbacks`` report): the scheduling path's
garbage is freed by reference counting. Error paths do make cycles (an exception's traceback
holds the frames that hold it): 3,000 requests over real HTTP, a third of them malformed and
one in twenty hanging up mid-body, left 6,131 objects in cycles that the young collections
freed and 119 that a full collection found later (one aiohttp ``RequestHandler`` with its
``Request`` and ``ConnectionResetError``, the client's transports), which this policy would
keep. ``extender.gc_freeze_survivors: false`` turns it off.

:func:`cleanup_ctx` does this once, after the inventory is ready, for the process entry
point (:mod:`extender.main`) and the benchmark, and removes the callback at cleanup; tests
that build apps leave the collector alone. Neighbours: reads
:attr:`extender.state.Inventory.ready` of the app built by :mod:`extender.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from aiohttp import web

from extender import tasks
from extender.server import INVENTORY, CleanupContext
from extender.state import Inventory
from flexlease.logging import ctx

log = logging.getLogger(__name__)

GEN0_THRESHOLD: Final = 2_000
"""Allocations (minus deallocations) of tracked objects between young collections. CPython's
default, 700, is reached by about every other filter request (its Pod and candidate list);
a young collection costs in proportion to the young objects, so fewer, larger ones cost
about the same in total and run the older generations less often. The count misses churn: a
node view that replaces a frozen one adds one young object and takes one away from the
count, so a generation-1 pass finds several times the threshold in the young generations.
Each collection lands inside some request, so the threshold trades pause length against how
many requests wait for one: with 1,000 (ninth round, six alternating pairs at 1,250 nodes)
the longest pause fell from 10.7 to 6.8 ms (medians), but twice as many collections raised
the p99 of prioritize by a third and of bind by two fifths, and GC CPU by a quarter.
Larger values make the generation-1 passes long (``hack/bench_extender.py --gen0``, 1,250
nodes, a loaded 2-core VM: with 20,000 the longest pause was 41 ms, with 2,000 between 9 and
38 ms, CPython's default with the freeze 32 ms; without the freeze 650-760 ms)."""
GEN1_THRESHOLD: Final = 2
"""Young collections between two generation-1 collections (CPython's default: 10). A
generation-1 pass traverses every object that survived the young collections since the
last one, together with everything those objects reference (a cached filter result
references a verdict per candidate node), so it is the longest pause the extender sees
during scheduling; a fifth of the default makes it about a fifth as long, at the same total
cost. Measured with ``hack/bench_extender.py --gen1`` at 1,250 nodes on a 2-core VM: at
load 13-15, with 10 the longest pause was 73 ms wall (15 ms on CPU), with 3 9.8 ms (5.6 ms
on CPU); after the eighth round, whose array re-checks allocate fewer small objects (so
young collections come less often and each generation-1 pass finds more of the large
per-class verdict lists), six runs each: with 3 7.7-21.8 ms, with 2 7.3-14.1 ms, the same GC
CPU per cycle (0.034-0.075 and 0.037-0.066 ms). Full collections are not made more frequent:
CPython runs one only when the objects promoted since the last one exceed a quarter of
those it kept then."""
POLL_SECONDS: Final = 0.05
"""How often the context looks whether the initial list is done."""


def freeze_survivors(phase: str, info: Mapping[str, Any]) -> None:
    """A :data:`gc.callbacks` callback: when a generation-1 or full collection ends (``phase``
    ``"stop"``, ``info["generation"]`` 1 or 2), move what it kept, and every other tracked
    object, to the permanent generation (:func:`gc.freeze`: three list splices, no
    traversal)."""
    if phase == "stop" and info["generation"] >= 1:
        gc.freeze()


def freeze(
    *, gen0_threshold: int = GEN0_THRESHOLD, gen1_threshold: int = GEN1_THRESHOLD, survivors: bool = True
) -> int:
    """Collect everything, freeze what survives, set the generation-0 and generation-1
    thresholds and, with ``survivors``, install :func:`freeze_survivors` (once). Returns the
    number of frozen objects. Process-wide: call once, after the initial list."""
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    gen2 = gc.get_threshold()[2]
    gc.set_threshold(gen0_threshold, gen1_threshold, gen2)
    if survivors and freeze_survivors not in gc.callbacks:
        gc.callbacks.append(freeze_survivors)
    frozen = gc.get_freeze_count()
    log.info(
        "froze the listed inventory out of the garbage collector's way",
        extra=ctx(
            objects=frozen,
            seconds=round(time.perf_counter() - start, 3),
            gen0=gen0_threshold,
            gen1=gen1_threshold,
            freeze_survivors=survivors,
        ),
    )
    return frozen


def cleanup_ctx(
    *, gen0_threshold: int = GEN0_THRESHOLD, gen1_threshold: int = GEN1_THRESHOLD, survivors: bool = True
) -> CleanupContext:
    """An aiohttp cleanup context for :func:`extender.server.create_app` that calls
    :func:`freeze` once the app's inventory is ready (Pods and GPUNodes listed), from the
    named task ``extender-gc-freeze`` (``survivors``: as :func:`freeze`'s, the setting
    ``extender.gc_freeze_survivors``), and removes :func:`freeze_survivors` at cleanup."""

    async def wait_and_freeze(inventory: Inventory) -> None:
        while not inventory.ready:  # noqa: ASYNC110 (the inventory is pure: no event to wait on)
            await asyncio.sleep(POLL_SECONDS)
        inventory.snapshot()  # the node views too: built now, frozen with the rest
        freeze(gen0_threshold=gen0_threshold, gen1_threshold=gen1_threshold, survivors=survivors)
        await asyncio.get_running_loop().create_future()  # done; owned until cleanup

    async def context(app: web.Application) -> AsyncIterator[None]:
        try:
            async with tasks.running(wait_and_freeze(app[INVENTORY]), name="extender-gc-freeze"):
                yield
        finally:
            with contextlib.suppress(ValueError):  # not installed: the inventory was never ready
                gc.callbacks.remove(freeze_survivors)

    return context
