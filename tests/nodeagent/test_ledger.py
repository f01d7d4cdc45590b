"""The availability ledger: interval math, tiering, bounded size, the file (atomic write,
crash between write and rename, a writer killed at every step of a write, corrupt file) and
restart survival — and, with hypothesis,
weeks of simulated GPU history whose ratio and tier equal a brute-force recomputation."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexlease import atomicfile
from flexlease.api import tiers
from flexlease.api.resources import Health
from flexlease.api.tiers import Tier
from nodeagent import ledger
from nodeagent.ledger import Identity, Interval, Ledger, LedgerFile, Span, Thresholds
from tests.nodeagent import ledger_writer

REPO = Path(__file__).resolve().parents[2]

DAY = 86400.0
T0 = 1_700_000_000.0
GPU = Identity(
    uuid="GPU-0", model="NVIDIA H20", memory_mib=97871, pci_bus_id="00000000:18:00.0", minor_number=0
)
TH = Thresholds(window_seconds=14 * DAY, refresh_seconds=14 * DAY)


# ---------------------------------------------------------------------------- math


def test_record_and_advance_build_contiguous_intervals() -> None:
    dev = ledger.new(GPU, Span.HEALTHY, at=T0)
    dev = ledger.record(dev, Span.HEALTHY, at=T0 + 10)  # same state: extends only
    dev = ledger.record(dev, Span.UNHEALTHY, at=T0 + 100)
    dev = ledger.advance(dev, T0 + 160)
    dev = ledger.record(dev, Span.HEALTHY, at=T0 + 150)  # in the past: taken as the current end
    assert dev.intervals == (
        Interval(T0, T0 + 100, Span.HEALTHY),
        Interval(T0 + 100, T0 + 160, Span.UNHEALTHY),
        Interval(T0 + 160, T0 + 160, Span.HEALTHY),
    )
    assert dev.unhealthy_until() == T0 + 160


def test_zero_length_intervals_are_replaced_and_coalesced() -> None:
    dev = ledger.new(GPU, Span.UNKNOWN, at=T0)
    dev = ledger.record(dev, Span.HEALTHY, at=T0)  # the unknown start carried no time
    assert dev.intervals == (Interval(T0, T0, Span.HEALTHY),)
    dev = ledger.record(ledger.advance(dev, T0 + 5), Span.UNKNOWN, at=T0 + 5)
    dev = ledger.record(dev, Span.HEALTHY, at=T0 + 5)
    assert dev.intervals == (Interval(T0, T0 + 5, Span.HEALTHY),)


def test_availability_over_the_window_excludes_unknown_time() -> None:
    dev = ledger.new(GPU, Span.HEALTHY, at=T0)
    dev = ledger.record(dev, Span.UNHEALTHY, at=T0 + 10 * DAY)
    dev = ledger.record(dev, Span.UNKNOWN, at=T0 + 10 * DAY + 3600)
    dev = ledger.record(dev, Span.HEALTHY, at=T0 + 11 * DAY)
    avail = ledger.availability(dev, T0 + 20 * DAY, window_seconds=14 * DAY)
    # window = [6 d, 20 d]: healthy 4 d + (9 d - 3600 s)... computed by hand:
    healthy = (10 * DAY - 6 * DAY) + (20 * DAY - 11 * DAY)
    unknown = 11 * DAY - (10 * DAY + 3600)
    assert avail.window_seconds == 14 * DAY
    assert avail.unavailable_seconds == 3600
    assert avail.unknown_seconds == unknown
    assert avail.observed_seconds == healthy + 3600
    assert avail.ratio == 1 - 3600 / (healthy + 3600)
    assert (
        ledger.availability(dev, T0 + 40 * DAY, window_seconds=14 * DAY).ratio == 1.0
    )  # the outage left the window


def test_nothing_observed_is_ratio_one() -> None:
    dev = ledger.new(GPU, Span.UNKNOWN, at=T0)
    avail = ledger.availability(dev, T0 + 100, window_seconds=14 * DAY)
    assert (avail.ratio, avail.observed_seconds, avail.unknown_seconds) == (1.0, 0.0, 100.0)


def test_tier_downgrades_at_once_and_upgrades_only_at_refresh() -> None:
    th = Thresholds(window_seconds=14 * DAY, refresh_seconds=7 * DAY)
    dev = ledger.retier(ledger.new(GPU, Span.HEALTHY, at=T0), 1.0, now=T0, th=th)
    assert (dev.tier, dev.tier_refreshed_at) == (Tier.HA, T0)
    dev = ledger.retier(dev, 0.99, now=T0 + DAY, th=th)  # a failure: MA at once
    assert (dev.tier, dev.tier_computed_at, dev.tier_refreshed_at) == (Tier.MA, T0 + DAY, T0)
    dev = ledger.retier(dev, 0.5, now=T0 + 2 * DAY, th=th)
    assert dev.tier is Tier.LA
    dev = ledger.retier(dev, 1.0, now=T0 + 6 * DAY, th=th)  # recovered ratio, but no refresh yet
    assert dev.tier is Tier.LA
    dev = ledger.retier(dev, 0.98, now=T0 + 7 * DAY, th=th)  # refresh: recomputed, may go up
    assert (dev.tier, dev.tier_refreshed_at) == (Tier.MA, T0 + 7 * DAY)


def test_thresholds_are_configurable() -> None:
    th = Thresholds(ha=0.999, ma=0.9)
    dev = ledger.retier(ledger.new(GPU, Span.HEALTHY, at=T0), 0.9995, now=T0, th=th)
    assert dev.tier is Tier.HA
    assert ledger.retier(dev, 0.95, now=T0 + 1, th=th).tier is Tier.MA


def test_prune_bounds_size_and_keeps_lifetime_totals() -> None:
    dev = ledger.new(GPU, Span.HEALTHY, at=T0)
    t = T0
    for _ in range(1000):  # flapping every 30 minutes for ~3 weeks
        t += 1800
        dev = ledger.record(dev, Span.UNHEALTHY if dev.state is Span.HEALTHY else Span.HEALTHY, at=t)
    before = ledger.availability(dev, t, window_seconds=7 * DAY)
    pruned = ledger.prune(dev, t, window_seconds=7 * DAY)
    assert len(pruned.intervals) <= 7 * DAY / 1800 + 2
    assert ledger.availability(pruned, t, window_seconds=7 * DAY) == before
    total = sum(iv.end - iv.start for iv in pruned.intervals)
    folded = pruned.folded.healthy + pruned.folded.unhealthy + pruned.folded.unknown
    assert total + folded == t - T0
    # the current interval is always kept, however old
    old = ledger.new(GPU, Span.HEALTHY, at=T0)
    assert ledger.prune(old, T0 + 100 * DAY, window_seconds=7 * DAY).intervals == old.intervals


def test_resume_marks_the_downtime_unknown() -> None:
    dev = ledger.advance(ledger.new(GPU, Span.HEALTHY, at=T0), T0 + 100)
    dev = ledger.resume(dev, T0 + 400)
    assert dev.intervals[-1] == Interval(T0 + 100, T0 + 400, Span.UNKNOWN)
    assert ledger.availability(dev, T0 + 400, window_seconds=DAY).unknown_seconds == 300


def test_span_of_health() -> None:
    assert [Span.of(h) for h in Health] == [Span.HEALTHY, Span.UNHEALTHY, Span.UNKNOWN]


# ---------------------------------------------------------------------------- node ledger


def test_adopt_starts_new_history_for_a_replaced_gpu_and_drops_gone_ones() -> None:
    book = Ledger("n1", TH)
    book.adopt([(0, GPU), (1, Identity(uuid="GPU-1"))], T0)
    book.record(0, Health.UNHEALTHY, at=T0)
    book.record(1, Health.HEALTHY, at=T0)
    book.tick(T0 + 100)
    book.adopt([(0, Identity(uuid="GPU-new", model="NVIDIA H20"))], T0 + 100)
    assert set(book.devices) == {0}
    assert book.devices[0].identity.uuid == "GPU-new"
    assert book.devices[0].intervals == (Interval(T0 + 100, T0 + 100, Span.UNKNOWN),)


def test_tick_reports_availability_and_tier() -> None:
    book = Ledger("n1", TH)
    book.adopt([(0, GPU)], T0)
    book.record(0, Health.HEALTHY, at=T0)
    views = book.tick(T0 + DAY)
    assert views[0].tier is Tier.HA and views[0].availability.ratio == 1.0
    book.record(0, Health.UNHEALTHY, at=T0 + DAY)
    views = book.tick(T0 + DAY + 3600)
    assert views[0].tier is Tier.LA  # 1 h down in 25 h observed: 96 % < 97 %, downgraded at once
    assert views[0].availability.ratio == pytest.approx(1 - 3600 / (DAY + 3600))


# ---------------------------------------------------------------------------- file


def make_book(node: str = "n1") -> Ledger:
    book = Ledger(node, TH)
    book.adopt([(0, GPU), (1, Identity(uuid="GPU-1", model="NVIDIA H20", memory_mib=97871))], T0)
    book.record(0, Health.HEALTHY, at=T0)
    book.record(1, Health.HEALTHY, at=T0)
    book.record(1, Health.UNHEALTHY, at=T0 + 50)
    book.tick(T0 + 100)
    return book


def test_file_round_trip(tmp_path: Path) -> None:
    book = make_book()
    f = LedgerFile(tmp_path / "state")
    f.save(book.encode(T0 + 100))
    decoded = f.load()
    assert decoded is not None
    assert decoded.node == "n1" and decoded.written_at == T0 + 100
    assert decoded.devices == book.devices
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["ledger.json"]


def test_first_start_has_no_file(tmp_path: Path) -> None:
    assert LedgerFile(tmp_path / "new").load() is None


def test_crash_between_write_and_rename_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = LedgerFile(tmp_path)
    old = make_book().encode(T0 + 100)
    f.save(old)

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="Input/output error"):
        f.save(b'{"half": ')
    monkeypatch.undo()
    assert f.path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # temp file removed


def test_temp_file_left_by_a_killed_process_is_ignored_and_removed(tmp_path: Path) -> None:
    f = LedgerFile(tmp_path)
    old = make_book().encode(T0 + 100)
    f.save(old)
    (tmp_path / ".ledger.json.tmp-4242").write_bytes(b'{"version": 1, "node": "n1", "wri')  # killed mid-write
    decoded = f.load()
    assert decoded is not None and decoded.written_at == T0 + 100
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


@pytest.mark.parametrize(
    "content",
    [
        b'{"version": 1, "node": "n1", "writtenAt": 17',  # truncated
        b"\x00\x00\x00\x00",  # zeroed blocks after a power loss
        b'{"version": 2, "node": "n1", "writtenAt": 1, "devices": {}}',  # unknown format
        json.dumps(
            {
                "version": 1,
                "node": "n1",
                "writtenAt": 10,
                "devices": {"0": {"uuid": "GPU-0", "intervals": [[5, 3, "healthy"]]}},
            }
        ).encode(),  # interval ends before it starts
        json.dumps(
            {
                "version": 1,
                "node": "n1",
                "writtenAt": 10,
                "devices": {"0": {"uuid": "GPU-0", "intervals": [[5, 30, "healthy"]]}},
            }
        ).encode(),  # ends after the write
    ],
)
def test_corrupt_file_is_moved_aside_and_reported(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    reported: list[tuple[Path, str]] = []
    f = LedgerFile(tmp_path, on_corrupt=lambda moved, why: reported.append((moved, why)))
    f.path.write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="nodeagent.ledger"):
        assert f.load() is None
    assert not f.path.exists()
    ((moved, why),) = reported
    assert moved.parent == tmp_path and moved.name.startswith("ledger.json.corrupt-")
    assert moved.read_bytes() == content  # kept, never silently dropped
    assert "not a valid ledger" in why
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    # a new ledger can be written next to it
    f.save(make_book().encode(T0 + 100))
    assert f.load() is not None
    assert moved.exists()


def test_restart_survival_downtime_is_unknown_and_tier_state_kept(tmp_path: Path) -> None:
    th = Thresholds(window_seconds=14 * DAY, refresh_seconds=3 * DAY)
    book = Ledger("n1", th)
    book.adopt([(0, GPU)], T0)
    book.record(0, Health.HEALTHY, at=T0)
    book.tick(T0)
    book.record(0, Health.UNHEALTHY, at=T0 + DAY)
    before = book.tick(T0 + DAY + 7200)[0]
    assert before.tier is Tier.LA  # 2 h of 26 h: below 97 %
    f = LedgerFile(tmp_path)
    f.save(book.encode(T0 + DAY + 7200))
    # the agent is down for 6 hours
    restart = T0 + DAY + 7200 + 6 * 3600
    again = Ledger.restored("n1", th, decoded=f.load(), now=restart)
    again.adopt([(0, GPU)], restart)
    again.record(0, Health.HEALTHY, at=restart)
    view = again.tick(restart)[0]
    assert view.availability.unknown_seconds == 6 * 3600
    assert view.availability.unavailable_seconds == 7200
    assert view.availability.observed_seconds == DAY + 7200
    assert view.tier is Tier.LA  # no upgrade before the refresh, across the restart
    assert again.devices[0].tier_refreshed_at == T0
    assert again.tick(T0 + 3 * DAY)[0].tier is Tier.LA  # refresh: 2 h of 2.75 d observed = 96.97 %
    assert again.tick(T0 + 4 * DAY)[0].tier is Tier.LA  # better now, but the next refresh is at 6 d
    assert again.tick(T0 + 6 * DAY)[0].tier is Tier.MA  # refresh: 2 h of 5.75 d observed


def test_another_nodes_file_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = LedgerFile(tmp_path)
    f.save(make_book("other").encode(T0 + 100))
    with caplog.at_level(logging.ERROR):
        book = Ledger.restored("n1", TH, decoded=f.load(), now=T0 + 200)
    assert book.devices == {}
    assert "another node" in caplog.text


def test_an_older_write_finishing_last_is_skipped(tmp_path: Path) -> None:
    """A periodic write that reaches the disk after the final one (its thread was slow) does not
    put the older ledger back."""
    f = LedgerFile(tmp_path)
    final = make_book().encode(T0 + 200)
    assert f.save(final, written_at=T0 + 200)
    assert not f.save(make_book().encode(T0 + 100), written_at=T0 + 100)
    assert f.path.read_bytes() == final
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


CRASH_POINTS = (*atomicfile.STEPS, "none")


async def test_a_writer_killed_at_any_point_leaves_the_old_or_the_new_ledger(tmp_path: Path) -> None:
    """kill -9 of a process writing the ledger, at every step of the write (one process per step,
    stopped there by the write's step hook): the file is always the old or the new version,
    byte for byte, the next start reads it without moving anything aside, and no interval of
    the old history is lost. (kill -9 tests a process crash; the fsyncs, which a power loss
    needs, are in the write but cannot be observed here.)"""
    old, new = ledger_writer.versions()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    async def kill_at(step: str) -> Path:
        state = tmp_path / step
        LedgerFile(state).save(old, written_at=ledger_writer.OLD_AT)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.nodeagent.ledger_writer",
            str(state),
            step,
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line == (b"done\n" if step == "none" else f"at {step}\n".encode()), step
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            await proc.wait()
        return state

    states = await asyncio.gather(*(kill_at(step) for step in CRASH_POINTS))
    old_devices = ledger.decode(old).devices
    for step, state in zip(CRASH_POINTS, states, strict=True):
        content = (state / "ledger.json").read_bytes()
        renamed = step in (atomicfile.STEP_RENAMED, atomicfile.STEP_DIR_SYNCED, "none")
        assert content == (new if renamed else old), step
        reported: list[tuple[Path, str]] = []
        decoded = LedgerFile(
            state, on_corrupt=lambda moved, why, into=reported: into.append((moved, why))
        ).load()
        assert not reported, step
        assert decoded is not None and decoded == ledger.decode(content), step
        for index, before in old_devices.items():  # the history is all there
            after = decoded.devices[index].intervals
            assert after[: len(before.intervals) - 1] == before.intervals[:-1], (step, index)
            last = after[len(before.intervals) - 1]
            assert (last.start, last.state) == (before.intervals[-1].start, before.intervals[-1].state)
            assert last.end >= before.intervals[-1].end
        assert [p.name for p in state.iterdir()] == ["ledger.json"], step  # the temp file removed


# ---------------------------------------------------------------------------- weeks, with hypothesis

MIN = 60.0  # the script's time unit; every boundary falls on a whole minute


@dataclass(frozen=True)
class Segment:
    kind: str  # healthy | unhealthy | nvml_down | agent_down
    minutes: int
    ticks: tuple[int, ...]  # minutes into the segment at which the agent ticks the ledger


durations = st.one_of(st.integers(min_value=1, max_value=120), st.integers(min_value=1, max_value=3 * 1440))
"""Short outages (minutes to two hours) and long stretches (up to three days)."""
segment = st.builds(
    Segment,
    kind=st.sampled_from(["healthy", "healthy", "healthy", "unhealthy", "nvml_down", "agent_down"]),
    minutes=durations,
    ticks=st.lists(st.integers(min_value=0, max_value=3 * 1440), max_size=3).map(lambda x: tuple(sorted(x))),
)
first = st.builds(
    Segment,
    kind=st.sampled_from(["healthy", "unhealthy"]),
    minutes=st.integers(min_value=1, max_value=3 * 1440),
    ticks=st.just(()),
)

STATE = {"healthy": Health.HEALTHY, "unhealthy": Health.UNHEALTHY, "nvml_down": Health.UNKNOWN}


class Oracle:
    """Brute force: one entry per minute of the script; the tier rule replayed on its ratios."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.minutes: list[str] = []
        self.tier: Tier | None = None
        self.refreshed: float | None = None
        self.at_refresh: Tier | None = None

    def ratio(self, now_min: int) -> tuple[float, float, float, float]:
        window_min = int(self.th.window_seconds // MIN)
        seen = self.minutes[max(0, now_min - window_min) : now_min]
        healthy = seen.count("healthy") * MIN
        unhealthy = seen.count("unhealthy") * MIN
        unknown = (seen.count("nvml_down") + seen.count("agent_down")) * MIN
        observed = healthy + unhealthy
        ratio = 1.0 - unhealthy / observed if observed > 0 else 1.0
        return ratio, observed, unhealthy, unknown

    def retier(self, ratio: float, now: float) -> Tier:
        current = tiers.classify(ratio, self.th.ha, self.th.ma)
        if self.tier is None or self.refreshed is None or now - self.refreshed >= self.th.refresh_seconds:
            self.tier, self.refreshed, self.at_refresh = current, now, current
        elif current < self.tier:
            self.tier = current
        assert self.at_refresh is not None and self.tier <= self.at_refresh  # never upgrades in between
        return self.tier


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head=first,
    rest=st.lists(segment, min_size=1, max_size=40),
    window_days=st.sampled_from([2, 7, 14]),
    refresh_days=st.sampled_from([1, 3, 7, 14]),
)
def test_weeks_of_history_match_a_brute_force_recomputation(
    head: Segment,
    rest: list[Segment],
    window_days: int,
    refresh_days: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    th = Thresholds(window_seconds=window_days * DAY, refresh_seconds=refresh_days * DAY)
    f = LedgerFile(tmp_path_factory.mktemp("ledger"))
    oracle = Oracle(th)
    book = Ledger("n1", th)
    book.adopt([(0, GPU)], T0)
    now_min = 0
    checked = 0

    def tick(at_min: int) -> None:
        nonlocal checked
        now = T0 + at_min * MIN
        view = book.tick(now)[0]
        ratio, observed, unhealthy, unknown = oracle.ratio(at_min)
        assert view.availability.ratio == ratio
        assert view.availability.observed_seconds == observed
        assert view.availability.unavailable_seconds == unhealthy
        assert view.availability.unknown_seconds == unknown
        assert view.tier is oracle.retier(ratio, now)
        checked += 1

    for seg in [head, *rest]:
        start = now_min
        if seg.kind == "agent_down":
            # the agent wrote the ledger (a tick, as the keeper does) and died; it restarts later
            tick(start)
            f.save(book.encode(T0 + start * MIN))
            oracle.minutes += ["agent_down"] * seg.minutes
            now_min += seg.minutes
            book = Ledger.restored("n1", th, decoded=f.load(), now=T0 + now_min * MIN)
            book.adopt([(0, GPU)], T0 + now_min * MIN)
            book.record(0, Health.UNKNOWN, at=T0 + now_min * MIN)
            continue
        book.record(0, STATE[seg.kind], at=T0 + start * MIN)
        for offset in seg.ticks:
            if offset < seg.minutes:
                oracle_len = start + offset
                oracle.minutes += [seg.kind] * (oracle_len - len(oracle.minutes))
                tick(oracle_len)
        oracle.minutes += [seg.kind] * (start + seg.minutes - len(oracle.minutes))
        now_min += seg.minutes
        tick(now_min)
    assert checked >= 2
    assert len(oracle.minutes) == now_min
