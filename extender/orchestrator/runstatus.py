"""When a completed lend or reclaim starts an orchestrator run, and the run's recorded state.
Pure: reads the GPULease and Pod JSON it is given; :mod:`extender.orchestrator.relaunch` does
the I/O.

A GPULease (Lend or Reclaim) that reached ``Done`` changes its owner's pods (WeFlex §3.2 step
e); if those pods name a framework profile (label ``flexlease.io/framework``) the job's launch
commands must run again, in the profile's order (§3.4). :func:`decide` says what to do now:

* nothing — the lease is not ``Done``, or no live pod of the owner (label
  ``flexlease.io/owner``, in the owner's namespace) names a framework: the job is not
  orchestrated;
* wait — the rollout controller's in-place restarts for this lease (``flexlease.io/rollout-status``
  on the lease) are still ``Progressing``, or have not started although the owner has pods
  opted in to them (``flexlease.io/restart-policy: InPlace``): commands run in the restarted
  containers, never in the ones about to be replaced;
* refuse — the pods name several frameworks or one no profile defines, or the in-place
  restarts ``Failed``; recorded, never retried for this lease generation;
* run — start, or resume a run a previous leader left ``Running`` (its succeeded steps are not
  executed again);
* finished — the annotation already holds a final phase for this lease's uid and generation.

The run's state is the annotation ``flexlease.io/orchestration-status`` on the lease
(:class:`OrchestrationStatus`).
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError

from extender.orchestrator.profile import Profile
from extender.orchestrator.runner import JobRef, RunResult
from extender.rollout import plan as rollout
from flexlease.api import keys
from flexlease.api.base import KubeModel
from flexlease.api.pod import is_terminated
from flexlease.api.resources import GPULease, LeasePhase, parse_gpulease


class RunPhase(enum.StrEnum):
    """Phase of an orchestrator run; all but ``Running`` are final."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REFUSED = "Refused"


class CommandStatus(KubeModel):
    """One command's final state (``Succeeded``, ``Failed``, ``TimedOut``, ``Skipped``),
    executions attempted and why."""

    state: str
    attempts: int = 0
    message: str = ""


class OrchestrationStatus(KubeModel):
    """The ``flexlease.io/orchestration-status`` annotation.

    ``lease_uid``/``lease_generation``: the lease (``metadata.uid``, ``metadata.generation``)
    the run belongs to; ``profile``: the framework profile; ``replicas``: pods expected per
    role, fixed when the run starts; ``done``: ``[command, pod uid]`` steps that succeeded;
    ``starts``: how many leaders started it (more than 1: resumed after a restart)."""

    lease_uid: str
    lease_generation: int
    profile: str = ""
    phase: RunPhase
    replicas: dict[str, int] = Field(default_factory=dict)
    commands: dict[str, CommandStatus] = Field(default_factory=dict)
    done: tuple[tuple[str, str], ...] = ()
    message: str = ""
    starts: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def final(self) -> bool:
        return self.phase is not RunPhase.RUNNING

    def render(self) -> str:
        """The annotation value (compact JSON, sorted keys)."""
        return json.dumps(self.to_json_obj(), separators=(",", ":"), sort_keys=True)

    def finished(self, result: RunResult, *, now: datetime) -> OrchestrationStatus:
        """This run, ended with ``result``: ``Succeeded`` when every command succeeded, else
        ``Failed`` with a message naming each command that did not."""
        bad = [o for o in result.outcomes.values() if o.state != "Succeeded"]
        message = "; ".join(
            f"{o.command} {o.state}: {o.message}" if o.message else f"{o.command} {o.state}" for o in bad
        )
        return self.model_copy(
            update={
                "phase": RunPhase.FAILED if bad else RunPhase.SUCCEEDED,
                "commands": {
                    name: CommandStatus(state=str(o.state), attempts=o.attempts, message=o.message)
                    for name, o in result.outcomes.items()
                },
                "done": tuple(sorted(result.done)),
                "message": message or f"{len(result.outcomes)} commands succeeded",
                "finished_at": now,
            }
        )


def parse_status(value: object) -> OrchestrationStatus | None:
    """The annotation's status, or None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return OrchestrationStatus.model_validate_json(value)
    except ValidationError:
        return None


class Action(enum.StrEnum):
    NONE = "None"
    WAIT = "Wait"
    REFUSE = "Refuse"
    RUN = "Run"
    FINISHED = "Finished"


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` says. ``status``: for ``Run`` the status to write when the run
    starts (``Running``, ``starts`` counted, ``done`` carried over), for ``Refuse`` the final
    one; ``profile``/``job``: what to run."""

    action: Action
    reason: str = ""
    status: OrchestrationStatus | None = None
    profile: Profile | None = None
    job: JobRef | None = None
    resumed: bool = False
    lease: GPULease | None = field(default=None, repr=False)


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


def job_pods(pods: Iterable[Mapping[str, Any]], owner: str) -> list[Mapping[str, Any]]:
    """The live pods of job ``owner`` (``<ns>/<job>``) the orchestrator can watch: in the
    owner's namespace, labelled ``flexlease.io/owner=<job>``, not terminated or being deleted."""
    namespace, _, job = owner.partition("/")
    out = []
    for pod in pods:
        meta = _meta(pod)
        if meta.get("namespace") != namespace or _labels(pod).get(keys.LABEL_OWNER) != job:
            continue
        if meta.get("deletionTimestamp") or is_terminated(dict(pod)):
            continue
        out.append(pod)
    return out


def decide(
    lease_obj: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    profiles: Mapping[str, Profile],
    *,
    now: datetime,
) -> Decision:
    """What to do about ``lease_obj`` now (see the module docstring). ``pods``: every pod the
    caller knows; ``profiles``: the registry by name. Never raises on bad input."""
    try:
        lease = parse_gpulease(dict(lease_obj))
    except ValidationError:
        return Decision(Action.NONE, "invalid GPULease")
    if lease.status.phase is not LeasePhase.DONE:
        return Decision(Action.NONE, f"lease is {lease.status.phase.value}")
    meta = _meta(lease_obj)
    raw_annotations = meta.get("annotations")
    annotations: dict[str, Any] = raw_annotations if isinstance(raw_annotations, dict) else {}
    uid = str(meta.get("uid") or "")
    generation = meta.get("generation")
    generation = generation if isinstance(generation, int) else 0
    previous = parse_status(annotations.get(keys.ANN_ORCHESTRATION_STATUS))
    if previous is not None and (previous.lease_uid, previous.lease_generation) != (uid, generation):
        previous = None  # another lease of that name, or a new generation: a new run
    if previous is not None and previous.final:
        return Decision(Action.FINISHED, f"run {previous.phase.value}", status=previous, lease=lease)

    owner = lease.spec.owner
    members = job_pods(pods, owner)
    frameworks = sorted({str(f) for p in members if (f := _labels(p).get(keys.LABEL_FRAMEWORK))})
    if previous is not None and previous.profile:
        frameworks = [previous.profile]  # a resumed run keeps its profile
    if not frameworks:
        return Decision(Action.NONE, f"no pod of {owner} names a framework profile", lease=lease)

    def refused(reason: str) -> Decision:
        status = OrchestrationStatus(
            lease_uid=uid,
            lease_generation=generation,
            profile=frameworks[0] if len(frameworks) == 1 else "",
            phase=RunPhase.REFUSED,
            message=reason,
            finished_at=now,
        )
        return Decision(Action.REFUSE, reason, status=status, lease=lease)

    if len(frameworks) > 1:
        return refused(f"the pods of {owner} name several frameworks: {', '.join(frameworks)}")
    profile = profiles.get(frameworks[0])
    if profile is None:
        return refused(f"no framework profile {frameworks[0]!r} (profiles: {', '.join(sorted(profiles))})")

    ro = rollout.parse_rollout_status(annotations.get(keys.ANN_ROLLOUT_STATUS))
    if ro is not None and ro.phase is rollout.RolloutPhase.FAILED:
        return refused(f"the in-place restarts after the lease failed: {ro.last_error or 'no detail'}")
    if ro is not None and ro.phase is rollout.RolloutPhase.SKIPPED:
        # the rollout controller's age guard passed this completion over (a lease done before
        # it started, or too old): its job reconfigured long ago, so no commands run either
        return Decision(
            Action.NONE, f"the lease's reconfiguration was skipped: {ro.message or 'no detail'}", lease=lease
        )
    if ro is not None and ro.phase is rollout.RolloutPhase.PROGRESSING:
        return Decision(Action.WAIT, f"in-place restarts in progress ({ro.updated}/{ro.total})", lease=lease)
    opted_in = any(_labels(p).get(keys.LABEL_RESTART_POLICY) == keys.RESTART_POLICY_IN_PLACE for p in members)
    if ro is None and opted_in:
        return Decision(Action.WAIT, "waiting for the in-place restarts to start", lease=lease)

    if previous is not None:
        replicas = dict(previous.replicas)
    else:
        counted = Counter(str(_labels(p).get(keys.LABEL_ROLE) or "") for p in members)
        replicas = {role: counted[role] for role in profile.roles if counted[role]}
    status = OrchestrationStatus(
        lease_uid=uid,
        lease_generation=generation,
        profile=profile.name,
        phase=RunPhase.RUNNING,
        replicas=replicas,
        done=previous.done if previous is not None else (),
        message="running",
        starts=(previous.starts if previous is not None else 0) + 1,
        started_at=previous.started_at if previous is not None and previous.started_at else now,
    )
    namespace, _, job_name = owner.partition("/")
    job = JobRef(namespace=namespace, owner=job_name, replicas=replicas)
    return Decision(
        Action.RUN,
        "resuming" if previous is not None else "starting",
        status=status,
        profile=profile,
        job=job,
        resumed=previous is not None,
        lease=lease,
    )
