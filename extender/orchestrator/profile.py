"""Framework dependency profiles (WeFlex §3.4): which commands a framework's pods run, on which
role, under which preconditions — read from YAML, validated with pydantic, checked for unknown
roles, unknown commands and cycles. Pure: parses text, does no file or network I/O except in
:func:`load_file` / :func:`load_dir`, which only read the given paths.

A profile (``apiVersion: flexlease.io/v1alpha1``, ``kind: FrameworkProfile``)::

    name: mpi
    restartTogether: true                  # in-place rollouts restart every pod of a wave at once
    roles:
      coordinator: {critical: true}        # never noticed or evicted by a Reclaim
      worker: {}
    commands:
      - name: launch
        role: coordinator                  # runs in every pod of this role
        run: [mpirun, --host, "{worker.hosts}", python, train.py]
        preconditions:
          - ready: worker                  # every expected worker pod is Ready (snapshot)
          - completed: sshd                # edge in the DAG: that command finished first

``run`` is an argv; ``{<role>.<field>}`` and ``{self.<field>}`` are filled from the readiness
snapshot when the command runs (:mod:`extender.orchestrator.template`); ``{{``/``}}`` are
literal braces. Errors are :class:`~flexlease.errors.ProfileError` carrying the file, the
1-based line and column of the offending YAML node (from PyYAML's node marks) and the field
path, e.g. ``mpi.yaml:14:13: commands[0].preconditions[0].ready: unknown role 'wrker'``.
"""

from __future__ import annotations

import functools
import graphlib
import importlib.resources
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from extender.orchestrator import template
from flexlease.api import keys
from flexlease.errors import ProfileError

NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""Profile, role and command names: DNS-1123 labels (they become label values)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Role(_Frozen):
    """A kind of pod in the job. ``critical``: losing it stops the whole job (the coordinator,
    Ray head, rank 0), so the lease controller never gives it a reclaim notice or evicts it.
    ``container``: the container commands run in (default: the pod's first container)."""

    critical: bool = False
    container: str | None = None
    description: str = ""


class Precondition(_Frozen):
    """Exactly one of: ``ready: <role>`` — every expected pod of that role is Ready in the latest
    readiness snapshot; ``completed: <command>`` — that command finished successfully (a DAG edge)."""

    ready: str | None = None
    completed: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Precondition:
        if (self.ready is None) == (self.completed is None):
            raise ValueError("a precondition has exactly one of 'ready: <role>' or 'completed: <command>'")
        return self


class Command(_Frozen):
    """One operational action: ``run`` (argv template) executed in every pod of ``role`` once
    the ``preconditions`` hold. ``timeout_seconds``: one execution's limit."""

    name: str = Field(pattern=NAME_PATTERN)
    role: str
    run: tuple[str, ...] = Field(min_length=1)
    preconditions: tuple[Precondition, ...] = ()
    timeout_seconds: float = Field(default=60.0, gt=0, le=3600, alias="timeoutSeconds")
    description: str = ""

    @field_validator("run")
    @classmethod
    def _templates_parse(cls, run: tuple[str, ...]) -> tuple[str, ...]:
        for arg in run:
            template.placeholders(arg)  # raises ValueError on a malformed placeholder
        return run

    @property
    def upstream(self) -> tuple[str, ...]:
        """Commands that must finish first (the ``completed`` preconditions), in order."""
        return tuple(p.completed for p in self.preconditions if p.completed is not None)


class Profile(_Frozen):
    """A framework's dependency profile: roles and commands. Build with :func:`parse`, which
    also checks references and acyclicity; constructing it directly checks only the schema."""

    api_version: Literal["flexlease.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["FrameworkProfile"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    roles: Mapping[str, Role] = Field(min_length=1)
    commands: tuple[Command, ...] = Field(min_length=1)
    restart_together: bool = Field(default=False, alias="restartTogether")
    """The job cannot lose one pod while the others run on (MPI: one rank's exit aborts
    ``mpirun``; collective training re-forms its process group): an in-place rollout restarts
    every pod of a wave at once (``extender.rollout``) rather than one at a time."""

    @field_validator("roles")
    @classmethod
    def _role_names(cls, roles: Mapping[str, Role]) -> Mapping[str, Role]:
        for name in roles:
            if not re.match(NAME_PATTERN, name) or name == template.SELF:
                raise ValueError(f"role name {name!r} must be a DNS-1123 label other than 'self'")
        return roles

    def command(self, name: str) -> Command:
        """The command called ``name``. Raises ``KeyError``."""
        for cmd in self.commands:
            if cmd.name == name:
                return cmd
        raise KeyError(name)

    @property
    def critical_roles(self) -> frozenset[str]:
        return frozenset(name for name, role in self.roles.items() if role.critical)


# -- parsing with node marks ----------------------------------------------------------------------

Loc = tuple[str | int, ...]


def parse(text: str, *, source: str = "<string>") -> Profile:
    """Parse and fully validate one profile from YAML ``text``.

    Raises :class:`ProfileError` (with line and column of the offending node) for YAML syntax
    errors, schema violations, duplicate command names, a role or command referenced but not
    declared, and dependency cycles (the message names the cycle, ``a → b → a``)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        raise ProfileError(
            f"not valid YAML: {exc.problem or exc}", source=source, line=line, column=col
        ) from exc
    if root is None:
        raise ProfileError("empty document", source=source)
    data = yaml.SafeLoader(text).get_single_data()
    if not isinstance(data, dict):
        raise _at(root, (), "a profile is a mapping", source)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = _yaml_loc(first["loc"], data)
        raise _at(root, loc, first["msg"], source) from exc
    _check_references(profile, root, source)
    _check_acyclic(profile, root, source)
    return profile


def load_file(path: Path) -> Profile:
    """Read and :func:`parse` one YAML file. Raises :class:`ProfileError` (also when unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read: {exc}", source=str(path)) from exc
    return parse(text, source=str(path))


def load_dir(directory: Path) -> dict[str, Profile]:
    """Every ``*.yaml``/``*.yml`` in ``directory`` (not recursive), by profile name. Raises
    :class:`ProfileError` on the first bad file or when two files declare the same name."""
    found: dict[str, Profile] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        profile = load_file(path)
        if profile.name in found:
            raise ProfileError(f"profile {profile.name!r} is declared twice", source=str(path), path="name")
        found[profile.name] = profile
    return found


BUILTIN: Final = ("mpi", "pytorch", "ray", "tensorflow")
"""The profiles shipped in ``extender/orchestrator/profiles/``."""


def builtin() -> dict[str, Profile]:
    """The shipped profiles (MPI, PyTorch distributed, Ray, TensorFlow), by name."""
    out: dict[str, Profile] = {}
    base = importlib.resources.files("extender.orchestrator") / "profiles"
    for name in BUILTIN:
        res = base / f"{name}.yaml"
        out[name] = parse(res.read_text(encoding="utf-8"), source=f"profiles/{name}.yaml")
    return out


def registry(user_dirs: Iterable[Path] = ()) -> dict[str, Profile]:
    """Built-in profiles plus every profile in ``user_dirs``; a user's profile with a built-in's
    name replaces it (so an operator can tune ``mpi``). Raises :class:`ProfileError`."""
    out = builtin()
    for directory in user_dirs:
        out.update(load_dir(directory))
    return out


@functools.cache
def builtin_critical() -> Mapping[str, frozenset[str]]:
    """:func:`critical_roles` of the shipped profiles (parsed once per process)."""
    return critical_roles(builtin())


def critical_for(user_dirs: Sequence[Path] = ()) -> Mapping[str, frozenset[str]]:
    """Critical roles of the :func:`registry` with ``user_dirs`` (the shipped profiles' cached
    answer when there are none). Raises :class:`ProfileError` on a bad user profile."""
    return critical_roles(registry(user_dirs)) if user_dirs else builtin_critical()


def critical_roles(profiles: Mapping[str, Profile]) -> dict[str, frozenset[str]]:
    """``{profile name: roles it marks critical}`` — what coordinator protection consults."""
    return {name: p.critical_roles for name, p in profiles.items()}


def is_critical(pod_labels: Mapping[str, str], critical: Mapping[str, frozenset[str]]) -> bool:
    """Whether a pod with these labels holds a critical role. A pod naming its framework
    (``flexlease.io/framework``) is judged by that profile; one naming only a role, or an
    unknown framework, is critical when any profile marks that role critical (err on the side of
    protecting a coordinator)."""
    role = pod_labels.get(keys.LABEL_ROLE)
    if not role or not isinstance(role, str):  # labels from a request body: not always strings
        return False
    framework = pod_labels.get(keys.LABEL_FRAMEWORK)
    if isinstance(framework, str) and framework in critical:
        return role in critical[framework]
    return any(role in roles for roles in critical.values())


# -- checks beyond the schema -------------------------------------------------------------------


def _check_references(profile: Profile, root: yaml.Node, source: str) -> None:
    names: dict[str, int] = {}
    for i, cmd in enumerate(profile.commands):
        if cmd.name in names:
            raise _at(root, ("commands", i, "name"), f"duplicate command name {cmd.name!r}", source)
        names[cmd.name] = i
    roles = sorted(profile.roles)
    for i, cmd in enumerate(profile.commands):
        if cmd.role not in profile.roles:
            raise _at(
                root,
                ("commands", i, "role"),
                f"unknown role {cmd.role!r} (roles: {', '.join(roles)})",
                source,
            )
        for j, pre in enumerate(cmd.preconditions):
            if pre.ready is not None and pre.ready not in profile.roles:
                raise _at(
                    root,
                    ("commands", i, "preconditions", j, "ready"),
                    f"unknown role {pre.ready!r} (roles: {', '.join(roles)})",
                    source,
                )
            if pre.completed is not None and pre.completed not in names:
                raise _at(
                    root,
                    ("commands", i, "preconditions", j, "completed"),
                    f"unknown command {pre.completed!r} (commands: {', '.join(names)})",
                    source,
                )
        for k, arg in enumerate(cmd.run):
            for ref_role, _field in template.placeholders(arg):
                if ref_role != template.SELF and ref_role not in profile.roles:
                    raise _at(
                        root,
                        ("commands", i, "run", k),
                        f"placeholder names unknown role {ref_role!r} (roles: {', '.join(roles)})",
                        source,
                    )


def _check_acyclic(profile: Profile, root: yaml.Node, source: str) -> None:
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for cmd in profile.commands:
        sorter.add(cmd.name, *cmd.upstream)
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = list(exc.args[1])  # [a, b, ..., a]: each depends on the next
        index = next(i for i, c in enumerate(profile.commands) if c.name == cycle[0])
        pre = next(j for j, p in enumerate(profile.commands[index].preconditions) if p.completed == cycle[1])
        path = " → ".join(reversed(cycle))
        raise _at(
            root,
            ("commands", index, "preconditions", pre, "completed"),
            f"dependency cycle: {path}",
            source,
        ) from exc


def _yaml_loc(loc: Sequence[int | str], data: Any) -> Loc:
    """Map a pydantic error location to keys present in the YAML (aliases are already the YAML
    keys; drop pydantic's synthetic parts such as a union member name)."""
    out: list[str | int] = []
    cur: Any = data
    for part in loc:
        if isinstance(cur, dict):
            present = part in cur
        else:
            present = isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        if not present:
            if isinstance(part, str) and isinstance(cur, dict):
                out.append(part)  # a missing key: the mapping's mark, the key named in the path
            break
        out.append(part)
        cur = cur[part]
    return tuple(out)


def _at(root: yaml.Node, loc: Loc, message: str, source: str) -> ProfileError:
    node = root
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
    mark = node.start_mark
    return ProfileError(
        message, source=source, line=mark.line + 1, column=mark.column + 1, path=_format_loc(loc)
    )


def _child(node: yaml.Node, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(part, str):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return value  # type: ignore[no-any-return]
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]  # type: ignore[no-any-return]
    return None


def _format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
