"""Leader election on a ``coordination.k8s.io/v1`` Lease, over the Store Protocol.

The algorithm is client-go's ``tools/leaderelection`` (``tryAcquireOrRenew``) with its
``LeaseLock``: the Lease's ``spec`` holds ``holderIdentity``, ``leaseDurationSeconds``,
``acquireTime``, ``renewTime`` (MicroTime, RFC 3339 with microseconds) and
``leaseTransitions``. Every write carries the resourceVersion last read as a precondition,
so two candidates can never both believe they hold the lease, on any store (KubeStore,
SqliteStore shared by processes, MemoryStore).

* A candidate takes the Lease when it does not exist, has no holder, or has not changed
  for ``leaseDurationSeconds`` as measured on the candidate's own monotonic clock since it
  last saw the record change (clock skew between machines does not matter).
* The leader renews every ``retry_period`` seconds; when no renewal succeeded for
  ``renew_deadline`` seconds it stops leading (``is_leader`` false) and competes again.
  ``renew_deadline`` < ``lease_duration`` so it steps down before anyone may take over.
* On shutdown (``run`` cancelled) the leader releases the Lease (empty holder,
  ``leaseDurationSeconds: 1``) so a successor takes over at its next try, not a full
  lease duration later.

Use: run :meth:`LeaderElector.run` as a named task in the component's TaskGroup, and gate
leader-only work with :meth:`LeaderElector.while_leading` or :attr:`is_leader`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flexlease import tasks
from flexlease.config import LeaseSettings
from flexlease.errors import Conflict, NotFound, StoreError
from flexlease.logging import ctx
from flexlease.store.base import JsonObj, Kind, Store

log = logging.getLogger(__name__)

_JITTER = 1.2  # client-go JitterFactor for the acquire loop


@dataclass(frozen=True, slots=True, kw_only=True)
class ElectionConfig:
    """One election: the Lease ``namespace``/``name``, this candidate's ``identity`` (unique
    per process, e.g. the pod name), and the timings in seconds (client-go defaults 15/10/2).
    Raises ``ValueError`` unless lease_duration > renew_deadline > 1.2 × retry_period > 0."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election: identity must not be empty")
        if not self.lease_duration > self.renew_deadline > _JITTER * self.retry_period > 0:
            raise ValueError(
                "leader election: need lease_duration > renew_deadline > 1.2 * retry_period > 0, got "
                f"{self.lease_duration}, {self.renew_deadline}, {self.retry_period}"
            )

    @classmethod
    def from_settings(cls, settings: LeaseSettings, *, identity: str) -> ElectionConfig:
        """From ``LeaseSettings``: ``leader_lease_seconds`` is the lease duration; the renew
        deadline and retry period keep client-go's ratios (10/15 and 2/15 of it)."""
        duration = settings.leader_lease_seconds
        return cls(
            namespace=settings.leader_lease_namespace,
            name=settings.leader_lease_name,
            identity=identity,
            lease_duration=duration,
            renew_deadline=duration * 2 / 3,
            retry_period=duration * 2 / 15,
        )

    @property
    def lease_duration_seconds(self) -> int:
        """``spec.leaseDurationSeconds`` (an int32 on the wire; at least 1)."""
        return max(1, round(self.lease_duration))


def _micro_time() -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Competes for one Lease in ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        config: ElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._observed: dict[str, Any] = {}
        self._observed_at = 0.0
        self._observed_rv = ""
        self._leading = asyncio.Event()
        self._not_leading = asyncio.Event()
        self._not_leading.set()

    @property
    def config(self) -> ElectionConfig:
        return self._config

    @property
    def is_leader(self) -> bool:
        """True from a successful acquire until renewals fail past ``renew_deadline``."""
        return self._leading.is_set()

    @property
    def holder(self) -> str:
        """The ``holderIdentity`` last observed (``""``: none, or not read yet)."""
        return str(self._observed.get("holderIdentity") or "")

    async def wait_leading(self) -> None:
        """Return once this candidate leads."""
        await self._leading.wait()

    async def wait_not_leading(self) -> None:
        """Return once this candidate does not lead (at once if it never did)."""
        await self._not_leading.wait()

    async def run(self) -> None:
        """Acquire, renew, step down on renewal failure, compete again — until cancelled;
        on cancel, release the Lease if leading (``release_on_cancel``)."""
        try:
            while True:
                await self._acquire()
                await self._renew()
        finally:
            if self.is_leader:
                self._set_leading(False)
                if self._config.release_on_cancel:
                    await self._release()

    async def while_leading(self, work: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run ``work()`` in a task named ``name`` whenever this candidate leads; cancel it
        (and await it) when leadership is lost, then wait to lead again. ``work`` should run
        until cancelled; if it returns, it runs again only after the next acquisition.
        Runs until cancelled; an exception from ``work`` propagates."""
        while True:
            await self.wait_leading()
            task = asyncio.create_task(work(), name=name)
            lost = asyncio.create_task(self.wait_not_leading(), name=f"{name}/leadership")
            try:
                await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await tasks.stop(task, lost)  # raises the error ``work`` ended with
            if task.cancelled():
                continue  # leadership was lost
            await self.wait_not_leading()  # ``work`` returned: run it again after the next acquisition

    # -- the loops ---------------------------------------------------------------------------

    async def _acquire(self) -> None:
        cfg = self._config
        while True:
            if await self._try(budget=cfg.renew_deadline):
                self._set_leading(True)
                log.info(
                    "became leader", extra=ctx(lease=f"{cfg.namespace}/{cfg.name}", identity=cfg.identity)
                )
                return
            await asyncio.sleep(cfg.retry_period * (1.0 + _JITTER * random.random()))

    async def _renew(self) -> None:
        cfg = self._config
        renewed_at = self._clock()
        while True:
            await asyncio.sleep(cfg.retry_period)
            while True:
                left = renewed_at + cfg.renew_deadline - self._clock()
                if left <= 0:
                    self._set_leading(False)
                    log.warning(
                        "lost leadership: no renewal within the renew deadline",
                        extra=ctx(
                            lease=f"{cfg.namespace}/{cfg.name}",
                            identity=cfg.identity,
                            deadline_seconds=cfg.renew_deadline,
                        ),
                    )
                    return
                if await self._try(budget=left):
                    renewed_at = self._clock()
                    break
                if self.holder and self.holder != cfg.identity:
                    self._set_leading(False)
                    log.warning(
                        "lost leadership: the lease has another holder",
                        extra=ctx(
                            lease=f"{cfg.namespace}/{cfg.name}", identity=cfg.identity, holder=self.holder
                        ),
                    )
                    return
                await asyncio.sleep(
                    min(cfg.retry_period, max(0.0, renewed_at + cfg.renew_deadline - self._clock()))
                )

    def _set_leading(self, leading: bool) -> None:
        if leading:
            self._not_leading.clear()
            self._leading.set()
        else:
            self._leading.clear()
            self._not_leading.set()

    # -- one attempt (client-go tryAcquireOrRenew) --------------------------------------------

    async def _try(self, *, budget: float) -> bool:
        """One tryAcquireOrRenew bounded by ``budget`` seconds; False on failure (logged)."""
        try:
            async with asyncio.timeout(budget):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            log.warning("leader election call timed out", extra=ctx(identity=self._config.identity))
        except StoreError as exc:
            log.warning(
                "leader election call failed", extra=ctx(identity=self._config.identity, error=str(exc))
            )
        return False

    def _record(self, *, acquire_time: str, transitions: int, now: str) -> JsonObj:
        return {
            "holderIdentity": self._config.identity,
            "leaseDurationSeconds": self._config.lease_duration_seconds,
            "acquireTime": acquire_time,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _observe(self, spec: JsonObj, rv: str) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()
        self._observed_rv = rv

    def _valid(self) -> bool:
        duration = float(self._observed.get("leaseDurationSeconds") or 0)
        return self._observed_at + duration > self._clock()

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self._config
        now = _micro_time()
        holding = self.holder == cfg.identity
        # 1. fast path: the leader renews against the version it last wrote
        if holding and self.is_leader and self._valid() and self._observed_rv:
            record = self._record(
                acquire_time=str(self._observed.get("acquireTime") or now),
                transitions=int(self._observed.get("leaseTransitions") or 0),
                now=now,
            )
            try:
                lease = await self._write(record)
            except Conflict:
                pass  # fall back to the slow path with a fresh read
            else:
                self._observe(lease["spec"], str(lease["metadata"]["resourceVersion"]))
                return True
        # 2. read (or create) the Lease
        try:
            lease = await self._store.get(Kind.LEASE, cfg.name, namespace=cfg.namespace)
        except NotFound:
            record = self._record(acquire_time=now, transitions=0, now=now)
            try:
                created = await self._store.create(
                    Kind.LEASE,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                        "spec": record,
                    },
                )
            except Conflict:
                return False  # another candidate created it first
            self._observe(created["spec"], str(created["metadata"]["resourceVersion"]))
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(spec, str(lease["metadata"]["resourceVersion"]))
        holding = self.holder == cfg.identity
        # 3. held by someone else and not expired: wait
        if self.holder and self._valid() and not holding:
            return False
        # 4. take or keep it, against the version just read
        if holding:
            record = self._record(
                acquire_time=str(spec.get("acquireTime") or now),
                transitions=int(spec.get("leaseTransitions") or 0),
                now=now,
            )
        else:
            record = self._record(
                acquire_time=now, transitions=int(spec.get("leaseTransitions") or 0) + 1, now=now
            )
        try:
            written = await self._write(record)
        except Conflict:
            return False
        if not holding:
            log.info(
                "took over the lease",
                extra=ctx(
                    lease=f"{cfg.namespace}/{cfg.name}",
                    identity=cfg.identity,
                    previous=spec.get("holderIdentity"),
                ),
            )
        self._observe(written["spec"], str(written["metadata"]["resourceVersion"]))
        return True

    async def _write(self, record: JsonObj) -> JsonObj:
        cfg = self._config
        return await self._store.patch(
            Kind.LEASE,
            cfg.name,
            {"spec": record},
            namespace=cfg.namespace,
            resource_version=self._observed_rv,
        )

    async def _release(self) -> None:
        """Give the Lease up (client-go ``release``): empty holder, 1 s duration."""
        cfg = self._config
        if self.holder != cfg.identity or not self._observed_rv:
            return
        now = _micro_time()
        record = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(self._observed.get("leaseTransitions") or 0),
        }
        try:
            async with asyncio.timeout(cfg.retry_period):
                try:
                    written = await self._write(record)
                except Conflict:
                    # a renewal cut short by the cancellation may have landed unseen (its
                    # reply lost): read the record again and release it if it is still ours
                    current = await self._store.get(Kind.LEASE, cfg.name, namespace=cfg.namespace)
                    self._observe(
                        dict(current.get("spec") or {}), str(current["metadata"]["resourceVersion"])
                    )
                    if self.holder != cfg.identity:
                        return
                    written = await self._write(record)
        except (StoreError, TimeoutError) as exc:
            log.warning(
                "could not release the lease; it expires by itself",
                extra=ctx(lease=f"{cfg.namespace}/{cfg.name}", identity=cfg.identity, error=str(exc)),
            )
            return
        self._observe(written["spec"], str(written["metadata"]["resourceVersion"]))
        log.info("released the lease", extra=ctx(lease=f"{cfg.namespace}/{cfg.name}", identity=cfg.identity))


async def run_leader_only(
    work: Callable[[], Coroutine[Any, Any, None]],
    settings: LeaseSettings,
    *,
    store: Store,
    instance: str,
    name: str,
    elector: LeaderElector | None = None,
) -> None:
    """Run ``work()`` (a controller's ``run``) until cancelled: at once without
    ``settings.leader_election``; else only while this replica (``instance``) leads, with
    ``elector`` when the caller already runs one (the extender shares one between bind and its
    controllers), or with an elector of its own, run beside it. Tasks are named after
    ``name`` (``<name>-term``, ``<name>-leader-election``, ``<name>-leading``). An exception
    from ``work`` propagates."""
    if not settings.leader_election:
        await work()
        return
    if elector is not None:
        await elector.while_leading(work, name=f"{name}-term")
        return
    own = LeaderElector(store, ElectionConfig.from_settings(settings, identity=instance))
    async with asyncio.TaskGroup() as group:
        group.create_task(own.run(), name=f"{name}-leader-election")
        group.create_task(own.while_leading(work, name=f"{name}-term"), name=f"{name}-leading")
