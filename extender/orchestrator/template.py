"""Command templates: ``{<role>.<field>}`` and ``{self.<field>}`` placeholders in a profile's
``run`` argv, filled from the readiness snapshot when the command runs. Pure.

Syntax is Python's format-string syntax (parsed by :class:`string.Formatter`, so ``{{`` and
``}}`` are literal braces) restricted to ``{name.field}`` with no conversion or format spec.

Role fields (pods of that role sorted by name): ``hosts`` (comma-separated IPs), ``endpoints``
(comma-separated ``ip:port``), ``names`` (comma-separated pod names), ``count``, and of the
first pod (rank 0): ``ip``, ``port``, ``endpoint``, ``name``. ``self`` fields (the pod the
command runs in): ``name``, ``namespace``, ``ip``, ``port``, ``endpoint``, ``rank`` (its index
in its role).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Final

from extender.orchestrator.snapshot import PodState

SELF: Final = "self"
ROLE_FIELDS: Final = frozenset({"hosts", "endpoints", "names", "count", "ip", "port", "endpoint", "name"})
SELF_FIELDS: Final = frozenset({"name", "namespace", "ip", "port", "endpoint", "rank"})

_FORMATTER: Final = string.Formatter()


def placeholders(arg: str) -> list[tuple[str, str]]:
    """The ``(name, field)`` placeholders in one argv element. Raises ``ValueError`` for
    unbalanced braces, a placeholder without exactly one dot, an unknown field, a conversion
    (``!r``) or a format spec (``:x``)."""
    out: list[tuple[str, str]] = []
    try:
        parts = list(_FORMATTER.parse(arg))
    except ValueError as exc:
        raise ValueError(f"{arg!r}: {exc} (write '{{{{' and '}}}}' for literal braces)") from exc
    for _literal, fname, spec, conversion in parts:
        if fname is None:
            continue
        if spec or conversion:
            raise ValueError(f"{arg!r}: placeholder {{{fname}}} takes no conversion or format spec")
        name, dot, fld = fname.partition(".")
        if not dot or not name or "." in fld or "[" in fname:
            raise ValueError(
                f"{arg!r}: placeholder {{{fname}}} must be {{<role>.<field>}} or {{self.<field>}}"
            )
        allowed = SELF_FIELDS if name == SELF else ROLE_FIELDS
        if fld not in allowed:
            raise ValueError(
                f"{arg!r}: {{{fname}}}: unknown field {fld!r} (one of: {', '.join(sorted(allowed))})"
            )
        out.append((name, fld))
    return out


def render(argv: Sequence[str], *, pods: Mapping[str, Sequence[PodState]], self_pod: PodState) -> list[str]:
    """Fill every placeholder. ``pods``: the snapshot's pods by role (sorted by name).
    Raises ``ValueError`` when a placeholder needs a pod the role does not have (``{head.ip}``
    with no head pod) — the caller treats that as an unmet precondition."""
    return [_render_one(arg, pods, self_pod) for arg in argv]


def _render_one(arg: str, pods: Mapping[str, Sequence[PodState]], self_pod: PodState) -> str:
    out: list[str] = []
    for literal, fname, _spec, _conv in _FORMATTER.parse(arg):
        out.append(literal)
        if fname is None:
            continue
        name, _, fld = fname.partition(".")
        out.append(
            _self_field(self_pod, pods, fld) if name == SELF else _role_field(name, pods.get(name, ()), fld)
        )
    return "".join(out)


def _self_field(pod: PodState, pods: Mapping[str, Sequence[PodState]], fld: str) -> str:
    if fld == "rank":
        peers = [p.name for p in pods.get(pod.role, ())]
        return str(peers.index(pod.name)) if pod.name in peers else "0"
    return _pod_field(pod, fld)


def _role_field(role: str, pods: Sequence[PodState], fld: str) -> str:
    if fld == "count":
        return str(len(pods))
    if fld in ("hosts", "endpoints", "names"):
        single = {"hosts": "ip", "endpoints": "endpoint", "names": "name"}[fld]
        return ",".join(_pod_field(p, single) for p in pods)
    if not pods:
        raise ValueError(f"{{{role}.{fld}}}: role {role!r} has no pods")
    return _pod_field(pods[0], fld)


def _pod_field(pod: PodState, fld: str) -> str:
    if fld == "ip":
        return pod.ip
    if fld == "port":
        return str(pod.port)
    if fld == "endpoint":
        return pod.endpoint
    if fld == "namespace":
        return pod.namespace
    return pod.name
