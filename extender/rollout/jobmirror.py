"""The rollout controller's cache of one training-operator kind (PyTorchJob, MPIJob,
RayCluster): a :class:`~extender.lease.mirror.Mirror` for a kind the cluster may not serve.

Those kinds are other projects' CRDs: a cluster without the training-operator or KubeRay
answers 404 to their list. Rather than an informer retrying (and warning) forever,
:meth:`JobMirror.run` first probes with a list; while the kind is not served it logs that
once, counts as :attr:`JobMirror.settled` (so the controller is ready without it) and probes
again every ``probe_seconds``; once served, it mirrors like any other kind. The mirror also
carries the two writes the controller makes on a job — :meth:`fetch` (``get``) and
:meth:`annotate` (a merge patch of ``metadata.annotations``) — so they name the mirror's
kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from extender.lease.mirror import Mirror
from flexlease.clock import Clock
from flexlease.errors import NotFound, StoreError
from flexlease.logging import ctx
from flexlease.store.base import EventType, JsonObj, Kind, Store

log = logging.getLogger(__name__)


class JobMirror(Mirror):
    """A :class:`Mirror` of ``kind`` that waits, quietly, for the kind to be served."""

    def __init__(
        self,
        store: Store,
        kind: Kind,
        *,
        on_change: Callable[[EventType, JsonObj], None],
        clock: Clock,
        probe_seconds: float,
    ) -> None:
        # named, not super(): hack/api_calls.py follows the kind into Mirror's list and watch
        Mirror.__init__(self, store, kind, on_change=on_change)
        self._store = store
        self._clock = clock
        self._probe_seconds = probe_seconds
        self._absent = asyncio.Event()
        self.served = False
        """True once a list of the kind succeeded."""

    @property
    def settled(self) -> bool:
        """Listed, or known not to be served (the controller's readiness)."""
        return self.listed.is_set() or self._absent.is_set()

    async def run(self) -> None:
        """Probe until the kind is served, then list and watch until cancelled. Errors other
        than ``NotFound`` are left to the informer's retries."""
        while True:
            try:
                await self._store.list(self.kind)
            except NotFound:
                if not self._absent.is_set():
                    log.info(
                        "kind not served; in-place rollouts of it wait for its CRD",
                        extra=ctx(kind=self.kind.value, probe_seconds=self._probe_seconds),
                    )
                    self._absent.set()
                tick = asyncio.Event()
                await self._clock.wait(tick, self._probe_seconds)
                continue
            except StoreError:
                pass  # the informer retries and reports other store errors
            break
        self.served = True
        if self._absent.is_set():
            log.info("kind served now; mirroring it", extra=ctx(kind=self.kind.value))
        await super().run()

    async def fetch(self, name: str, namespace: str) -> JsonObj:
        """The job, read from the store. Raises ``NotFound``, ``StoreError``."""
        return await self._store.get(self.kind, name, namespace=namespace)

    async def annotate(
        self, name: str, namespace: str, annotations: dict[str, str], *, resource_version: str | None
    ) -> JsonObj:
        """Merge ``annotations`` into the job's metadata, with ``resource_version`` as the
        precondition; remembers and returns the new object. Raises ``Conflict``, ``NotFound``."""
        new = await self._store.patch(
            self.kind,
            name,
            {"metadata": {"annotations": annotations}},
            namespace=namespace,
            resource_version=resource_version,
        )
        self.put(new)
        return new
