"""Which completed GPULeases still call for a reconfiguration restart. Pure.

The rollout controller restarts a job's pods after a lend or reclaim completes (WeFlex §3.2
step e) — but only for completions it observes. On its first start, after an upgrade, or on a
new leader, the store already holds ``Done`` leases from the past: their jobs reconfigured long
ago (or were never meant to, before the controller existed), and restarting every such job at
start-up would interrupt training across the cluster for nothing. So a ``Done`` lease with no
``flexlease.io/rollout-status`` yet is reconfigured only when :func:`due` says so:

* the controller saw it before it was ``Done`` (``seen_unfinished``: a phase other than
  ``Done`` since the controller started) — a completion it observed; or
* its completion time (:func:`completed_at`) is known and not earlier than the controller's
  start (the lease completed while the controller was listing);

and in both cases never when the completion is older than ``max_age`` (config
``lease.reconfigure_max_age_seconds``). A lease passed over gets a ``Skipped`` rollout status
with the reason (decided once). A lease whose rollout already started (status present) is
always carried on: a restart mid-rollout must not strand half a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from extender.lease.view import parse_time


def completed_at(lease: Mapping[str, Any]) -> datetime | None:
    """When a ``Done`` lease completed: the latest ``lastTransitionTime`` of its conditions
    whose status is ``"True"`` (the lease controller flips ``Tagged`` for a lend and
    ``GPUsFreed`` for a reclaim to True when it finishes; ``metav1.Condition`` moves the time
    only when the status flips). None when no such condition has a readable time."""
    status = lease.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    latest: datetime | None = None
    for condition in conditions if isinstance(conditions, list) else ():
        if not isinstance(condition, dict) or condition.get("status") != "True":
            continue
        raw = condition.get("lastTransitionTime")
        try:
            when = parse_time(raw) if isinstance(raw, str) else None
        except ValueError:
            when = None
        if when is not None and (latest is None or when > latest):
            latest = when
    return latest


@dataclass(frozen=True, slots=True)
class Verdict:
    """:func:`due`'s answer: ``due`` and, when not, ``reason`` (for the log)."""

    due: bool
    reason: str = ""


def due(
    *,
    seen_unfinished: bool,
    completed: datetime | None,
    observed_done: datetime | None,
    started: datetime,
    now: datetime,
    max_age: timedelta,
) -> Verdict:
    """Whether a ``Done`` lease without a rollout status gets its reconfiguration (module
    docstring). ``completed``: :func:`completed_at`; ``observed_done``: when this controller
    first saw it ``Done`` after seeing it unfinished (None otherwise); ``started``: when the
    controller started; all aware datetimes. ``max_age`` applies to ``completed``, else to
    ``observed_done``."""
    when = completed if completed is not None else observed_done
    if when is not None and now - when > max_age:
        return Verdict(False, f"completed {(now - when).total_seconds():.0f}s ago, over the maximum age")
    if seen_unfinished:
        return Verdict(True)
    if completed is None:
        return Verdict(False, "done before this controller started, completion time unknown")
    if completed < started:
        return Verdict(False, "completed before this controller started")
    return Verdict(True)
