"""Which pod is kubelet admitting? Pure matching of kubelet's device-plugin requests against
the extender's per-device assignments on this node. No I/O.

kubelet's ``GetPreferredAllocation`` and ``Allocate`` carry device IDs only, never the pod.
The extender's assignments (``flexlease.io/assigned-uuids``) of the pods on one node are
disjoint, so:

* :func:`allocated_pod`: a non-empty device set kubelet allocates lies inside the assignment
  of at most one pod — that pod is the one being admitted (no timestamps, no node lock);
* :func:`prefer`: for ``GetPreferredAllocation`` the candidates are the pods bound here whose
  assignment is not yet (fully) allocated. A non-empty ``must_include`` pins the pod as above.
  Otherwise, among the pods that fit (assigned devices available, the right count), the one
  kubelet's PodResources ``List`` shows admitted but without (all) its devices is the pod being
  admitted (kubelet adds a pod to its pod manager before admitting it and releases its device
  manager lock during GetPreferredAllocation, so ``List`` answers then and shows it;
  ``listed``). When that does not single one out (no ``listed``, or several such pods), the
  fits are ranked: exact fits (the pod's remaining devices = the requested size) before partial
  ones (a pod whose containers are allocated one by one), then in the order the agent saw them
  bound (``seq``), among the fitting pods kubelet lists when it lists any (a pod not in its
  pod manager is not being admitted). Such a choice is marked ``ambiguous``; the PodResources
  reconcile (:mod:`nodeagent.deviceplugin.reconcile`) checks it afterwards and exchanges
  assignments when kubelet admitted another pod than guessed (:func:`exchange`).

Device IDs are NVML UUIDs (the IDs the plugin advertises).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod bound to this node with an assignment on it.

    ``key``: ``<namespace>/<name>``; ``uuids``: its assigned devices in ``assigned-uuids``
    order; ``allocated``: the part kubelet already allocated (by an earlier ``Allocate`` or as
    read from PodResources); ``seq``: the order the agent saw it bound (smaller = earlier)."""

    key: str
    uid: str
    uuids: tuple[str, ...]
    allocated: frozenset[str] = frozenset()
    seq: int = 0

    @property
    def remaining(self) -> tuple[str, ...]:
        """Assigned devices kubelet has not allocated yet, in assignment order."""
        return tuple(u for u in self.uuids if u not in self.allocated)


class PreferenceKind(enum.StrEnum):
    PINNED = "pinned"
    """``must_include`` named devices of exactly one pod."""
    UNIQUE = "unique"
    """Exactly one pod fits."""
    ADMITTING = "admitting"
    """kubelet's PodResources shows exactly one of the fitting pods being admitted."""
    UNFIT = "unfit"
    """kubelet's PodResources shows a pod of the book being admitted whose assignment does not
    fit the request (its devices not available yet, e.g. still held by a terminating pod),
    and none of the fitting pods: devices no pending pod is assigned are preferred."""
    ORDERED = "ordered"
    """Several pods fit equally; the first bound was taken."""
    NONE = "none"
    """No pod fits: kubelet's own choice (the first ``size`` available, must_include first)."""


@dataclass(frozen=True, slots=True)
class Preference:
    """The answer to one ``ContainerPreferredAllocationRequest``: ``devices`` (the IDs to
    prefer, exactly ``size`` of them when enough are available), the pod they belong to (None
    when no pod fits) and how it was chosen. ``others``: keys of the other pods that fit
    equally well (non-empty only for ``ORDERED``)."""

    devices: tuple[str, ...]
    pod: str | None
    kind: PreferenceKind
    others: tuple[str, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return self.kind is PreferenceKind.ORDERED


def _in_order(ids: Iterable[str], order: Sequence[str]) -> list[str]:
    wanted = set(ids)
    return [u for u in order if u in wanted]


def _under_admission(pod: PendingPod, listed: Mapping[str, frozenset[str]]) -> bool:
    """Whether kubelet's ``List`` shows ``pod`` without all of its assigned devices (the pod
    it is admitting, or one admitted container by container)."""
    held = listed.get(pod.key)
    return held is not None and held < frozenset(pod.uuids)


def _unassigned_first(
    available: Sequence[str], must_include: Sequence[str], size: int, claimed: AbstractSet[str] = frozenset()
) -> tuple[str, ...]:
    """``size`` devices for a request no fitting pod's assignment answers: ``must_include``,
    then the available devices outside ``claimed`` (pending pods' assignments), then those in
    it, each in kubelet's order (with nothing claimed: kubelet's own choice)."""
    must = set(must_include)
    rest = [u for u in available if u not in must]
    ordered = [u for u in rest if u not in claimed] + [u for u in rest if u in claimed]
    return tuple((list(must_include) + ordered)[:size])


def prefer(
    pods: Iterable[PendingPod],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    listed: Mapping[str, frozenset[str]] | None = None,
) -> Preference:
    """The preferred allocation for one container request (kubelet's
    ``available_deviceIDs``, ``must_include_deviceIDs``, ``allocation_size``). ``listed``:
    kubelet's PodResources ``List`` (``<ns>/<name>`` → device IDs of the resource), if read.

    Returns the devices of the pod being admitted (see the module docstring). With no fitting
    pod, returns ``must_include`` then available devices in kubelet's order up to ``size``
    (kubelet may ignore a preference, never a wrong one: the result is always a subset of
    ``available`` that contains ``must_include``). Raises ``ValueError`` when ``size`` is
    negative."""
    if size < 0:
        raise ValueError(f"allocation_size must be >= 0, got {size}")
    pods = list(pods)
    avail = set(available)
    must = set(must_include)
    fits: list[tuple[bool, int, PendingPod, tuple[str, ...]]] = []
    for pod in pods:
        assigned = set(pod.uuids)
        if not must <= assigned:
            continue
        extra = [u for u in pod.remaining if u in avail and u not in must]
        need = size - len(must)
        if need < 0 or len(extra) < need:
            continue
        chosen = tuple(_in_order(must | set(extra[:need]), pod.uuids))
        exact = len([u for u in pod.remaining if u not in must]) == need
        fits.append((exact, pod.seq, pod, chosen))
    if fits and must:
        # Disjoint assignments: only one pod can hold a non-empty must_include.
        _, _, pod, chosen = fits[0]
        return Preference(chosen, pod.key, PreferenceKind.PINNED)
    if listed is not None and not any(f[2].key in listed for f in fits):
        admitted = [p for p in pods if _under_admission(p, listed)]
        if admitted:  # known, and no fit: waiting for the pod watch changes nothing
            claimed = {u for p in pods for u in p.remaining}
            devices = _unassigned_first(available, must_include, size, claimed)
            return Preference(devices, admitted[0].key, PreferenceKind.UNFIT)
    if not fits:
        return Preference(_unassigned_first(available, must_include, size), None, PreferenceKind.NONE)
    if listed is not None:
        # kubelet admits only pods in its pod manager, which List shows: a fitting pod it does
        # not list is not the one being admitted (unless it lists none of them)
        shown = [f for f in fits if f[2].key in listed]
        fits = shown or fits
        admitting = [f for f in shown if _under_admission(f[2], listed)]
        if len(admitting) == 1:
            _, _, pod, chosen = admitting[0]
            return Preference(chosen, pod.key, PreferenceKind.ADMITTING)
    fits.sort(key=lambda f: (not f[0], f[1], f[2].key))
    best_exact = fits[0][0]
    equal = [f for f in fits if f[0] == best_exact]
    _, _, pod, chosen = equal[0]
    if len(equal) == 1:
        return Preference(chosen, pod.key, PreferenceKind.UNIQUE)
    return Preference(chosen, pod.key, PreferenceKind.ORDERED, tuple(f[2].key for f in equal[1:]))


def allocated_pod(pods: Iterable[PendingPod], devices: Iterable[str]) -> PendingPod | None:
    """The pod whose assignment contains every one of ``devices`` (kubelet's
    ``ContainerAllocateRequest.devices_ids``), or None (no pod, an empty set, or the devices
    span several pods' assignments). Assignments on a node are disjoint, so at most one pod
    matches a non-empty set."""
    wanted = set(devices)
    if not wanted:
        return None
    for pod in pods:
        if wanted <= set(pod.uuids):
            return pod
    return None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """What kubelet gave a pod (``actual``, from PodResources) differs from its assignment
    (``assigned``); both as UUID sets."""

    key: str
    assigned: frozenset[str]
    actual: frozenset[str]


def compare(key: str, assigned: Iterable[str], actual: Iterable[str]) -> Mismatch | None:
    """A :class:`Mismatch` when the two device sets differ (order does not matter), else None."""
    a, b = frozenset(assigned), frozenset(actual)
    return None if a == b else Mismatch(key, a, b)


def exchange(
    key: str,
    actual: Sequence[str],
    pods: Iterable[PendingPod],
    *,
    allocated: Mapping[str, frozenset[str]],
) -> dict[str, tuple[str, ...]]:
    """The assignments to write when kubelet gave pod ``key`` the devices ``actual`` instead of
    its assignment: ``key`` gets ``actual``, and every other pod whose assignment holds some of
    ``actual`` and that kubelet has not allocated yet (not in ``allocated``) gets those devices
    replaced one-for-one, in order, by the devices ``key`` was assigned and did not get (free
    now). So assignments stay disjoint and each pod still pending can be admitted onto its
    assignment. A pod that kubelet already allocated is left alone here: its own read-back
    entry corrects it. Returns ``<ns>/<name>`` → new device IDs (assignment order kept)."""
    by_key = {p.key: p for p in pods}
    out: dict[str, tuple[str, ...]] = {key: tuple(actual)}
    own = by_key.get(key)
    taken = set(actual)
    spare = [u for u in (own.uuids if own is not None else ()) if u not in taken]
    for pod in sorted(by_key.values(), key=lambda p: (p.seq, p.key)):
        if pod.key == key or pod.key in allocated or not taken & set(pod.uuids):
            continue
        new = []
        for u in pod.uuids:
            if u in taken:
                if not spare:
                    break
                new.append(spare.pop(0))
            else:
                new.append(u)
        else:
            out[pod.key] = tuple(new)
    return out


def merge_container_devices(entries: Iterable[tuple[str, Sequence[str]]], resource: str) -> tuple[str, ...]:
    """The device IDs of ``resource`` in PodResources ``ContainerDevices`` entries
    ``(resource_name, device_ids)``, merged in order without repeats. kubelet sends one entry
    per device (``[('gpu', ['id-2']), ('gpu', ['id-3'])]``), so readers must merge."""
    out: list[str] = []
    seen: set[str] = set()
    for name, ids in entries:
        if name != resource:
            continue
        for i in ids:
            if i not in seen:
                seen.add(i)
                out.append(i)
    return tuple(out)
