"""Leader election on a coordination.k8s.io/v1 Lease, on every store: one leader at a time,
failover when the holder stops renewing, release on shutdown, stepping down when renewals
fail past the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexlease.config import LeaseSettings
from flexlease.errors import StoreError
from flexlease.store.base import JsonObj, Kind, Store
from flexlease.store.leader import ElectionConfig, LeaderElector
from tests.store.faults import FaultyStore
from tests.store.stores import STORE_KINDS, any_store

NS = "flexlease-system"


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with any_store(request.param, tmp_path) as s:
        yield s


def config(identity: str, *, release: bool = True) -> ElectionConfig:
    return ElectionConfig(
        namespace=NS,
        name="flexlease-extender",
        identity=identity,
        lease_duration=1.0,
        renew_deadline=0.6,
        retry_period=0.1,
        release_on_cancel=release,
    )


class FlakyStore:
    """A real store whose patches fail on demand (an API server this replica cannot reach);
    ``calls`` counts the elector's gets and patches (its attempts)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.failing = False
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def patch(self, *args: object, **kwargs: object) -> JsonObj:
        self.calls += 1
        if self.failing:
            raise StoreError("connection refused (injected)", status=503)
        return await self.inner.patch(*args, **kwargs)  # type: ignore[arg-type]

    async def get(self, *args: object, **kwargs: object) -> JsonObj:
        self.calls += 1
        if self.failing:
            raise StoreError("connection refused (injected)", status=503)
        return await self.inner.get(*args, **kwargs)  # type: ignore[arg-type]


class ManualClock:
    """A monotonic clock that moves only when told (the elector's lease arithmetic)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Overlaps:
    """What :func:`sampled` saw: samples taken, samples with two or more leaders, and the
    sequence of leadership states (a tuple of leading identities, consecutive repeats
    collapsed)."""

    samples: int = 0
    overlaps: int = 0
    states: list[tuple[str, ...]] = dataclasses.field(default_factory=list)


@contextlib.asynccontextmanager
async def sampled(*electors: LeaderElector, every: float = 0.002) -> AsyncIterator[Overlaps]:
    """Sample who leads every ``every`` seconds (and at each yield to the loop in between)
    in a task of its own, for the whole block: "never two leaders" is checked all along,
    not at two instants recorded by the test itself."""
    seen = Overlaps()

    async def sample() -> None:
        while True:
            leading = tuple(e.config.identity for e in electors if e.is_leader)
            seen.samples += 1
            seen.overlaps += len(leading) > 1
            if not seen.states or seen.states[-1] != leading:
                seen.states.append(leading)
            await asyncio.sleep(every)

    task = asyncio.create_task(sample(), name="leader-sampler")
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def attempts(store: FlakyStore, more: int) -> None:
    """Wait until the elector on ``store`` has made ``more`` further store calls."""
    target = store.calls + more
    async with asyncio.timeout(5):
        while store.calls < target:  # noqa: ASYNC110 - counts calls made by another task
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(elector: LeaderElector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run(), name=f"elector/{elector.config.identity}")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def lease_spec(store: Store) -> JsonObj:
    return dict((await store.get(Kind.LEASE, "flexlease-extender", namespace=NS))["spec"])


async def first_leader(*electors: LeaderElector) -> LeaderElector:
    async with asyncio.timeout(5):
        _, pending = await asyncio.wait(
            [asyncio.create_task(e.wait_leading(), name=f"wait/{e.config.identity}") for e in electors],
            return_when=asyncio.FIRST_COMPLETED,
        )
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return next(e for e in electors if e.is_leader)


async def test_exactly_one_leader(store: Store) -> None:
    fa, fb = FlakyStore(store), FlakyStore(store)
    a, b = LeaderElector(fa, config("a")), LeaderElector(fb, config("b"))  # type: ignore[arg-type]
    async with running(a), running(b):
        leader = await first_leader(a, b)
        async with sampled(a, b) as seen:
            await attempts(fa, 10)  # several renewals and lease durations
            await attempts(fb, 10)
        spec = await lease_spec(store)
    assert seen.overlaps == 0 and seen.samples > 10
    assert seen.states == [(leader.config.identity,)]
    assert spec["holderIdentity"] in ("", leader.config.identity)  # released on exit
    follower = b if leader is a else a
    assert follower.holder == leader.config.identity or follower.holder == ""


async def test_the_lease_records_holder_and_times(store: Store) -> None:
    fa = FlakyStore(store)
    a = LeaderElector(fa, config("a"))  # type: ignore[arg-type]
    async with running(a):
        async with asyncio.timeout(5):
            await a.wait_leading()
        first = await lease_spec(store)
        await attempts(fa, 4)  # two renewals (a get and a patch each)
        later = await lease_spec(store)
    assert first["holderIdentity"] == "a"
    assert first["leaseDurationSeconds"] == 1 and first["leaseTransitions"] == 0
    assert first["acquireTime"].endswith("Z") and len(first["acquireTime"]) == len(
        "2026-01-01T00:00:00.000000Z"
    )
    assert later["acquireTime"] == first["acquireTime"]
    assert later["renewTime"] > first["renewTime"]


async def test_failover_when_the_holder_stops_renewing(store: Store) -> None:
    a = LeaderElector(store, config("a", release=False))
    b_clock = ManualClock()
    fb = FlakyStore(store)
    b = LeaderElector(fb, config("b"), clock=b_clock)  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as stack:
        stop_a = await stack.enter_async_context(running(a))
        async with asyncio.timeout(5):
            await a.wait_leading()
        await stack.enter_async_context(running(b))
        await attempts(fb, 3)
        assert not b.is_leader
        stop_a.cancel()  # a is gone without a word: its lease must expire first
        with contextlib.suppress(asyncio.CancelledError):
            await stop_a
        await attempts(fb, 6)  # b keeps trying, but on its clock a's lease has not run out
        assert not b.is_leader and (await lease_spec(store))["holderIdentity"] == "a"
        b_clock.now += 1.0  # one lease duration since b last saw the record change
        async with asyncio.timeout(5):
            await b.wait_leading()
        spec = await lease_spec(store)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


async def test_release_on_shutdown_hands_over_at_once(store: Store) -> None:
    """b's clock stands still, so a's lease can never expire for b: b leads only because a
    released the Lease on shutdown."""
    a = LeaderElector(store, dataclasses.replace(config("a"), lease_duration=4.0, renew_deadline=2.0))
    fb = FlakyStore(store)
    b = LeaderElector(  # type: ignore[arg-type]
        fb, dataclasses.replace(config("b"), lease_duration=4.0, renew_deadline=2.0), clock=ManualClock()
    )
    async with contextlib.AsyncExitStack() as stack:
        stop_a = await stack.enter_async_context(running(a))
        async with asyncio.timeout(5):
            await a.wait_leading()
        await stack.enter_async_context(running(b))
        await attempts(fb, 3)
        assert not b.is_leader
        stop_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stop_a
        assert (await lease_spec(store))["holderIdentity"] in ("", "b")
        async with asyncio.timeout(5):
            await b.wait_leading()


async def test_steps_down_when_renewals_fail_past_the_deadline(store: Store) -> None:
    flaky = FlakyStore(store)
    a = LeaderElector(flaky, config("a"))  # type: ignore[arg-type]
    b = LeaderElector(store, config("b"))
    async with running(a):
        async with asyncio.timeout(5):
            await a.wait_leading()
        async with running(b), sampled(a, b) as seen:
            flaky.failing = True
            async with asyncio.timeout(5):
                await a.wait_not_leading()
                await b.wait_leading()
            flaky.failing = False  # a reaches the store again, but b holds a valid lease
            await attempts(flaky, 6)
            assert b.is_leader and not a.is_leader
    assert seen.overlaps == 0  # never two leaders, sampled all along
    assert seen.states[0] == ("a",) and seen.states[-1] == ("b",) and () in seen.states


async def test_while_leading_runs_work_only_while_leading(store: Store) -> None:
    flaky = FlakyStore(store)
    a = LeaderElector(flaky, config("a"))  # type: ignore[arg-type]
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with running(a):
        gate = asyncio.create_task(a.while_leading(work, name="lease-controller"), name="gate")
        try:
            async with asyncio.timeout(5):
                await started.wait()
                flaky.failing = True
                await cancelled.wait()
            assert not a.is_leader
        finally:
            gate.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gate


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="renew_deadline"):
        ElectionConfig(namespace=NS, name="x", identity="a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="identity"):
        ElectionConfig(namespace=NS, name="x", identity="")
    cfg = ElectionConfig.from_settings(LeaseSettings(leader_lease_seconds=15), identity="extender-0")
    assert (cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == pytest.approx((15, 10, 2))
    assert (cfg.namespace, cfg.name) == ("flexlease-system", "flexlease-extender")


async def test_release_after_a_renewal_cut_short_by_shutdown(store: Store) -> None:
    """Shutdown arrives while a renewal is in flight: the renewal lands but its reply is never
    read (as when SIGTERM cancels the request), so the release carries a stale
    resourceVersion and meets 409; it reads the Lease again and still releases it."""
    faulty = FaultyStore(store)
    a = LeaderElector(faulty, config("a"))  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        task = asyncio.create_task(a.run(), name="elector/a")
        await a.wait_leading()
        cut = faulty.fail(
            "patch", kind=Kind.LEASE, match='"holderIdentity": "a"', after=True, error=asyncio.CancelledError
        )
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert cut.fired == 1
    spec = await lease_spec(store)
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
