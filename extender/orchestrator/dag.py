"""The command DAG of a profile (WeFlex §3.4): one node per command, an edge A → B when B has
the precondition ``completed: A``; and the check of a command's preconditions against the
latest readiness snapshot. Pure: stdlib ``graphlib``, no I/O.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping
from dataclasses import dataclass

from extender.orchestrator import template
from extender.orchestrator.profile import Command, Profile
from extender.orchestrator.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Dag:
    """A validated profile's commands as a DAG. ``order``: one topological order (upstream
    first, ties in profile order); ``upstream``/``downstream``: direct edges by command name."""

    profile: Profile
    order: tuple[str, ...]
    upstream: Mapping[str, tuple[str, ...]]
    downstream: Mapping[str, tuple[str, ...]]

    def sorter(self) -> graphlib.TopologicalSorter[str]:
        """A fresh, prepared :class:`graphlib.TopologicalSorter` over the commands: call
        ``get_ready()`` for runnable commands and ``done(name)`` when one succeeded."""
        sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
        for name in self.order:
            sorter.add(name, *self.upstream[name])
        sorter.prepare()
        return sorter

    def descendants(self, name: str) -> frozenset[str]:
        """Every command downstream of ``name`` (transitively), not ``name`` itself."""
        seen: set[str] = set()
        stack = list(self.downstream[name])
        while stack:
            cur = stack.pop()
            if cur not in seen:
                seen.add(cur)
                stack.extend(self.downstream[cur])
        return frozenset(seen)


def build(profile: Profile) -> Dag:
    """The DAG of a profile from :func:`extender.orchestrator.profile.parse` (which has already
    rejected cycles and unknown commands; a cycle here raises ``graphlib.CycleError``)."""
    upstream = {c.name: c.upstream for c in profile.commands}
    downstream: dict[str, list[str]] = {c.name: [] for c in profile.commands}
    for name, ups in upstream.items():
        for up in ups:
            downstream[up].append(name)
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for cmd in profile.commands:
        sorter.add(cmd.name, *cmd.upstream)
    sorter.prepare()
    rank = {c.name: i for i, c in enumerate(profile.commands)}
    order: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=rank.__getitem__)
        order.extend(ready)
        sorter.done(*ready)
    return Dag(
        profile=profile,
        order=tuple(order),
        upstream=upstream,
        downstream={k: tuple(v) for k, v in downstream.items()},
    )


def unmet(command: Command, snapshot: Snapshot, replicas: Mapping[str, int]) -> list[str]:
    """Why ``command`` may not run now, given the latest snapshot; empty when it may.

    Checks every ``ready: <role>`` precondition (``replicas``: the expected pod count per role;
    a role not named there needs at least one pod and all its pods Ready), that the command's
    own role has its expected pods with running containers (to execute in), and that every
    role its template names has pods. ``completed`` preconditions are the DAG's business."""
    reasons: list[str] = []
    for pre in command.preconditions:
        if pre.ready is not None:
            why = snapshot.ready_unmet(pre.ready, replicas.get(pre.ready))
            if why:
                reasons.append(f"ready {why}")
    why = snapshot.running_unmet(command.role, replicas.get(command.role))
    if why:
        reasons.append(f"running {why}")
    for arg in command.run:
        for role, fld in template.placeholders(arg):
            if (
                role != template.SELF
                and fld not in ("hosts", "endpoints", "names", "count")
                and not snapshot.role(role)
            ):
                reasons.append(f"template {{{role}.{fld}}}: role {role!r} has no pods")
    return reasons
