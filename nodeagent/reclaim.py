"""Prelaunch for a reclaim (WeFlex §3.3): when a pod created to take back lent GPUs
(``flexlease.io/reclaim: "true"``, DESIGN §2) is bound to this node, the agent starts staging
its job's live input and pre-pulls the pod's images, before kubelet starts its containers.

The job is down, or runs at its smaller scale, from the reclaim until the reclaim pod's
containers run: the same window a hot restart opens, so it gets the same treatment — the
hot-restart controller's staging hook (:class:`nodeagent.hotrestart.controller.RestartStaging`,
in the agent :class:`nodeagent.hotrestart.component.RuntimeStaging`: W from formulas 1–3 with
the node's image and checkpoint caches, W_stage = W + the pod's margin,
:mod:`nodeagent.staging`). Staging begins at the first sight of the pod, the images are
pulled through the node's :class:`~nodeagent.cache.images.ImagePuller` (the kubelet's own
pull then finds them present), and the restart is over — the hook's ``restarted`` — once
every container of the pod runs (``status.containerStatuses[].state.running``, as kubelet
reports it) or the pod is deleted. From there the Stager ends the staging once the job has
read what was staged and commits from the live stream again.

A reclaim pod first seen with its containers already running (an agent restarted after the
fact) or terminated is left alone: its prelaunch window has passed. A pod without a stream
binding is only pre-pulled; a bad binding gets the Stager's ``StagingFailed`` Event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from flexlease import errors
from flexlease.api import keys
from flexlease.logging import ctx
from flexlease.store.base import EventType, JsonObj, Kind, Selector, Store, WatchEvent
from flexlease.store.informer import Informer
from nodeagent.cache.images import ImagePuller
from nodeagent.hotrestart.controller import RestartStaging

log = logging.getLogger(__name__)


def is_reclaim(pod: JsonObj) -> bool:
    """Whether ``pod`` is annotated ``flexlease.io/reclaim: "true"`` (IsReclaim)."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ANN_RECLAIM) == "true"


def images(pod: JsonObj) -> list[str]:
    """The pod's init and app container images, in start order, each once."""
    spec = pod.get("spec") or {}
    out: list[str] = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        image = str((c or {}).get("image") or "")
        if image and image not in out:
            out.append(image)
    return out


def containers_running(pod: JsonObj) -> bool:
    """Whether every app container of ``pod`` is reported running (``status.containerStatuses``)."""
    names = {str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or []}
    running = {
        str(s.get("name"))
        for s in (pod.get("status") or {}).get("containerStatuses") or []
        if "running" in (s.get("state") or {})
    }
    return bool(names) and names <= running


def finished(pod: JsonObj) -> bool:
    """Terminated (phase Succeeded/Failed) or being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


@dataclass
class _Reclaim:
    """One reclaim pod's prelaunch: what to call when its restart is over, and whether it is."""

    pod: str
    restarted: Callable[[], None] | None = None
    over: bool = False
    staged: bool = False

    def end(self) -> None:
        """The window is over (containers run, or the pod is gone): tell the staging once."""
        self.over = True
        if self.restarted is not None:
            self.restarted()
            self.restarted = None


class ReclaimPrelaunch:
    """Watches this node's pods and prelaunches reclaim pods (module docstring).

    ``staging``: the staging hook (begin → ``restarted``); ``puller``: the node's image puller
    (None: no pre-pull). :meth:`run` runs until cancelled. :attr:`reclaims` maps a pod UID to
    its prelaunch, for status and tests.
    """

    def __init__(
        self,
        store: Store,
        staging: RestartStaging,
        *,
        node: str,
        puller: ImagePuller | None = None,
    ) -> None:
        if not node:
            raise errors.RequestError("the reclaim prelaunch needs the node name")
        self.node = node
        self._staging = staging
        self._puller = puller
        self.reclaims: dict[str, _Reclaim] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._informer = Informer(
            store,
            Kind.POD,
            handler=self._on_event,
            selector=Selector(fields={"spec.nodeName": node}),
            name=f"reclaim-pods:{node}",
        )

    @property
    def listed(self) -> asyncio.Event:
        """Set once this node's pods have been listed."""
        return self._informer.listed

    async def run(self) -> None:
        """Watch and prelaunch until cancelled (prelaunches in flight are cancelled too)."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            await self._informer.run()

    async def _on_event(self, event: WatchEvent) -> None:
        pod = event.object
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        entry = self.reclaims.get(uid)
        if event.type is EventType.DELETED or finished(pod):
            if entry is not None and not entry.over:
                entry.end()
            return
        if entry is not None:
            if not entry.over and containers_running(pod):
                log.info(
                    "reclaim pod running; prelaunch window over", extra=ctx(pod=entry.pod, node=self.node)
                )
                entry.end()
            return
        if not is_reclaim(pod) or (pod.get("spec") or {}).get("nodeName") != self.node:
            return
        name = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        if containers_running(pod):
            return  # first seen running: its window has passed
        entry = self.reclaims[uid] = _Reclaim(name)
        assert self._tg is not None  # events arrive only while run() runs
        self._tg.create_task(self._prelaunch(pod, entry), name=f"reclaim-prelaunch:{name}")

    async def _prelaunch(self, pod: JsonObj, entry: _Reclaim) -> None:
        """Begin staging (W for the pod's first image), then pre-pull its images."""
        wanted = images(pod)
        log.info("prelaunch for a reclaim", extra=ctx(pod=entry.pod, node=self.node, images=wanted))
        restarted = await self._staging.begin(pod, image=wanted[0] if wanted else "")
        entry.staged = restarted is not None
        if entry.over:
            if restarted is not None:
                restarted()
        else:
            entry.restarted = restarted
        if self._puller is None:
            return
        for image in wanted:
            try:
                await self._puller.ensure(image, pod=entry.pod)
            except errors.CriError as exc:
                log.warning(
                    "reclaim pre-pull failed; kubelet pulls it",
                    extra=ctx(pod=entry.pod, node=self.node, image=image, error=str(exc)),
                )
