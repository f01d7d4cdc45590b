"""Restart order: which pods restart in which wave. Pure.

:class:`RestartOrder` is the seam: given a job's pods it returns waves of pod names (a wave
restarts once every pod of the earlier waves is back). Two orders:

* :class:`OrdinalOrder` — one wave, highest StatefulSet ordinal (or rank suffix) first, as
  Kubernetes rolls a StatefulSet; for image edits and for jobs without a profile.
* :class:`ProfileOrder` — from the job's framework profile (:mod:`extender.orchestrator.profile`,
  WeFlex §3.4): a role ``Q`` named in a ``ready: Q`` precondition of a command on role ``R``
  restarts before ``R`` (MPI: workers, then the coordinator that runs ``mpirun``); roles are
  grouped with stdlib ``graphlib`` (one wave per topological generation). Pods whose
  framework has no profile, or whose role the profile does not name, fall back to one wave.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from typing import Protocol

from extender.orchestrator.profile import Profile
from extender.rollout.plan import PodState
from flexlease.api import keys


class RestartOrder(Protocol):
    def waves(self, pods: Sequence[PodState]) -> list[list[str]]:
        """Pod names grouped into waves, in restart order; every pod exactly once."""
        ...

    def container(self, pod: PodState) -> str | None:
        """The container to restart in ``pod`` (None: its first container)."""
        ...


def _by_ordinal(pods: Sequence[PodState]) -> list[str]:
    return [p.name for p in sorted(pods, key=lambda p: (-p.ordinal, p.name))]


class OrdinalOrder:
    """One wave, highest ordinal first."""

    def waves(self, pods: Sequence[PodState]) -> list[list[str]]:
        return [_by_ordinal(pods)] if pods else []

    def container(self, pod: PodState) -> str | None:
        return None


def role_waves(profile: Profile) -> list[list[str]]:
    """The profile's roles grouped in restart order (see the module docstring); a cycle of
    ``ready`` preconditions puts every role in one wave."""
    graph: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for role in profile.roles:
        graph.add(role)
    for command in profile.commands:
        for pre in command.preconditions:
            if pre.ready is not None and pre.ready != command.role:
                graph.add(command.role, pre.ready)
    try:
        graph.prepare()
    except graphlib.CycleError:
        return [sorted(profile.roles)]
    out: list[list[str]] = []
    while graph.is_active():
        ready = sorted(graph.get_ready())
        out.append(ready)
        graph.done(*ready)
    return out


class ProfileOrder:
    """Waves by role from the pods' framework profile (``flexlease.io/framework`` and
    ``flexlease.io/role`` labels); ``profiles``: by name."""

    def __init__(self, profiles: Mapping[str, Profile]) -> None:
        self._profiles = profiles

    def _profile(self, pods: Sequence[PodState]) -> Profile | None:
        names = {p.labels.get(keys.LABEL_FRAMEWORK) for p in pods}
        if len(names) != 1:
            return None
        name = names.pop()
        return self._profiles.get(name) if name else None

    def waves(self, pods: Sequence[PodState]) -> list[list[str]]:
        profile = self._profile(pods)
        if profile is None or any(p.labels.get(keys.LABEL_ROLE) not in profile.roles for p in pods):
            return OrdinalOrder().waves(pods)
        out: list[list[str]] = []
        for roles in role_waves(profile):
            wave = _by_ordinal([p for p in pods if p.labels.get(keys.LABEL_ROLE) in roles])
            if wave:
                out.append(wave)
        return out

    def container(self, pod: PodState) -> str | None:
        profile = self._profiles.get(pod.labels.get(keys.LABEL_FRAMEWORK) or "")
        role = profile.roles.get(pod.labels.get(keys.LABEL_ROLE) or "") if profile is not None else None
        return role.container if role is not None else None
