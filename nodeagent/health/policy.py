"""The per-GPU health state machine (DESIGN §4). Pure: no I/O, no asyncio, no clock.

Inputs are NVML observations with their time (epoch seconds); output is the next
:class:`GpuHealth`. Rules:

* a critical XID (any XID not in ``application_xids``), a double-bit ECC error, a lost GPU
  (``NVML_ERROR_GPU_IS_LOST``, fallen off the bus) or a failed row remap → ``Unhealthy``;
* application XIDs (default 13, 31, 43, 45, 68, 109: faults of the program on the GPU, as in
  NVIDIA's k8s-device-plugin) and single-bit ECC errors (corrected) leave health alone but
  are recorded as ``last_xid``;
* an ``Unhealthy`` GPU becomes ``Healthy`` only when a query shows it ok and nothing bad has
  been seen for ``recovery_hold_down_seconds`` (NVIDIA's device plugin never recovers a GPU);
* while NVML is down (failed to initialise), every GPU is ``Unknown``: never advertised
  healthy when it cannot be seen. A GPU starts ``Unknown`` until its first query.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flexlease.api.resources import Health
from nodeagent.health.backend import DeviceEvent, DeviceSample, EventKind

DEFAULT_APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """A GPU's health. ``since``: when ``health`` last changed (epoch seconds);
    ``last_bad_at``: the last time anything made it unhealthy (hold-down counts from there);
    ``last_xid``: the last XID seen (application or critical)."""

    health: Health
    since: float
    reason: str | None = None
    last_bad_at: float | None = None
    last_xid: int | None = None


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The rules above, parameterised. ``recovery_hold_down_seconds`` >= 0."""

    application_xids: frozenset[int] = DEFAULT_APPLICATION_XIDS
    recovery_hold_down_seconds: float = 300.0

    def initial(self, now: float) -> GpuHealth:
        """A GPU not yet queried: ``Unknown``."""
        return GpuHealth(health=Health.UNKNOWN, since=now, reason="not yet queried")

    def is_critical(self, event: DeviceEvent) -> bool:
        """Whether ``event`` makes a GPU unhealthy."""
        if event.kind is EventKind.XID:
            return event.xid not in self.application_xids
        return event.kind in (EventKind.DOUBLE_BIT_ECC, EventKind.LOST)

    def on_event(self, state: GpuHealth, event: DeviceEvent) -> GpuHealth:
        """The state after ``event`` (at ``event.at``)."""
        xid = event.xid if event.kind is EventKind.XID else state.last_xid
        if not self.is_critical(event):
            return replace(state, last_xid=xid)
        reason = {
            EventKind.XID: f"XID {event.xid}",
            EventKind.DOUBLE_BIT_ECC: "double-bit ECC error",
            EventKind.LOST: "GPU is lost (fallen off the bus)",
        }[event.kind]
        return self._bad(replace(state, last_xid=xid), reason, event.at)

    def on_sample(self, state: GpuHealth, sample: DeviceSample) -> GpuHealth:
        """The state after a periodic query ``sample`` (at ``sample.at``)."""
        problem = sample.problem
        if problem is not None:
            return self._bad(state, problem, sample.at)
        if state.health is Health.HEALTHY:
            return state
        held = state.last_bad_at is None or sample.at - state.last_bad_at >= self.recovery_hold_down_seconds
        if held:
            return GpuHealth(
                health=Health.HEALTHY, since=sample.at, last_bad_at=state.last_bad_at, last_xid=state.last_xid
            )
        if state.health is Health.UNKNOWN:
            return replace(
                state,
                health=Health.UNHEALTHY,
                since=sample.at,
                reason=f"{state.reason or 'recovering'}; in recovery hold-down",
            )
        return state

    def on_backend_down(self, state: GpuHealth, reason: str, now: float) -> GpuHealth:
        """NVML is unavailable: ``Unknown`` with ``reason`` (keeps ``last_bad_at``)."""
        if state.health is Health.UNKNOWN and state.reason == reason:
            return state
        since = state.since if state.health is Health.UNKNOWN else now
        return replace(state, health=Health.UNKNOWN, since=since, reason=reason)

    def _bad(self, state: GpuHealth, reason: str, at: float) -> GpuHealth:
        since = state.since if state.health is Health.UNHEALTHY else at
        return replace(state, health=Health.UNHEALTHY, since=since, reason=reason, last_bad_at=at)

    def resume(self, *, unhealthy_until: float | None, now: float) -> GpuHealth:
        """The starting state after an agent restart: ``Unknown``, remembering that the GPU was
        unhealthy up to ``unhealthy_until`` (from the ledger) so that the hold-down still
        applies across the restart."""
        state = self.initial(now)
        if unhealthy_until is not None:
            return replace(state, last_bad_at=unhealthy_until, reason="unhealthy before the agent restarted")
        return state
