"""The age guard on lease reconfigurations (:mod:`extender.rollout.age`): only completions the
controller observes, never old ``Done`` leases found at start-up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from extender.rollout.age import completed_at, due

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
MAX_AGE = timedelta(minutes=10)


def lease(*conditions: tuple[str, str, str | None]) -> dict[str, object]:
    return {
        "status": {
            "phase": "Done",
            "conditions": [
                {"type": t, "status": s, **({"lastTransitionTime": when} if when is not None else {})}
                for t, s, when in conditions
            ],
        }
    }


def test_the_completion_time_is_the_latest_true_condition_transition() -> None:
    obj = lease(
        ("Accepted", "True", "2026-11-22T11:00:00Z"),
        ("GPUsFreed", "True", "2026-11-22T11:05:00Z"),
        ("Tagged", "False", "2026-11-22T11:09:00Z"),
    )
    assert completed_at(obj) == datetime(2026, 11, 22, 11, 5, tzinfo=UTC)


def test_unreadable_or_missing_times_give_no_completion_time() -> None:
    assert completed_at({}) is None
    assert completed_at({"status": {"conditions": "x"}}) is None
    assert completed_at(lease(("GPUsFreed", "True", None), ("Tagged", "True", "yesterday"))) is None
    assert completed_at(lease(("Tagged", "True", "2026-11-22T11:00:00"))) is None  # no zone


def verdict(**kw: object) -> bool:
    args: dict[str, object] = {
        "seen_unfinished": False,
        "completed": None,
        "observed_done": None,
        "started": START,
        "now": START + timedelta(minutes=1),
        "max_age": MAX_AGE,
    }
    args.update(kw)
    return due(**args).due  # type: ignore[arg-type]


def test_a_completion_the_controller_observed_is_due() -> None:
    assert verdict(seen_unfinished=True)
    assert verdict(seen_unfinished=True, observed_done=START + timedelta(seconds=30))
    assert verdict(seen_unfinished=True, completed=START + timedelta(seconds=30))


def test_a_lease_done_before_the_start_is_not_due() -> None:
    assert not verdict(completed=START - timedelta(seconds=1))
    assert not verdict(completed=None)  # done at the first list, no time: before the start


def test_a_lease_completed_after_the_start_is_due_even_if_first_seen_done() -> None:
    assert verdict(completed=START + timedelta(seconds=5))


def test_nothing_older_than_the_maximum_age_is_due() -> None:
    now = START + timedelta(hours=1)
    assert not verdict(seen_unfinished=True, completed=now - MAX_AGE - timedelta(seconds=1), now=now)
    assert not verdict(seen_unfinished=True, observed_done=now - MAX_AGE - timedelta(seconds=1), now=now)
    assert verdict(seen_unfinished=True, observed_done=now - MAX_AGE, now=now)
    reason = due(
        seen_unfinished=False,
        completed=START - timedelta(days=3),
        observed_done=None,
        started=START,
        now=START,
        max_age=MAX_AGE,
    ).reason
    assert "over the maximum age" in reason
