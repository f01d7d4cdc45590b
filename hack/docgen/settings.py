"""The configuration reference (``docs/reference/settings.md``) from the pydantic settings.

Every key of :class:`flexlease.config.Settings` — the top-level ones and each group's — with
its YAML path, environment variable (``FLEXLEASE_`` prefix, ``__`` between levels, as the
settings' ``env_prefix`` and ``env_nested_delimiter`` say), type, allowed values, default and
``Field(description=...)``. :func:`missing_descriptions` names the keys without one (a test
and ``hack/gen_docs.py`` fail on any). Pure: reads the classes, not the environment.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from hack.docgen.text import GENERATED, code, literal, prose, table

SOURCE: Final = "flexlease/config.py"

_TYPE_NAMES: Final[dict[object, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
}


@dataclass(frozen=True)
class Setting:
    """One key: ``path`` (``extender.port``), ``env`` (``FLEXLEASE_EXTENDER__PORT``), its
    ``type`` and ``allowed`` values in words, ``default`` as YAML shows it, ``description``."""

    path: str
    env: str
    type: str
    allowed: str
    default: str
    description: str


@dataclass(frozen=True)
class Group:
    """A settings group (``extender``, ``agent``…): its key, class docstring and settings;
    ``key`` is empty for the root's own settings."""

    key: str
    doc: str
    settings: tuple[Setting, ...]


def _is_group(info: FieldInfo) -> bool:
    return isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)


def type_name(annotation: Any) -> str:
    """An annotation in words: ``int`` → integer, ``Path | None`` → "path or null",
    ``tuple[str, ...]`` → "list of strings", ``Literal["a", "b"]`` → "one of `a`, `b`"."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(code(literal(a)) for a in args)
    if origin in (types.UnionType, typing.Union):
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (tuple, list, frozenset, set):
        item = type_name(args[0]) if args else "value"
        kind = "set" if origin in (frozenset, set) else "list"
        return f"{kind} of {_plural(item)}"
    if origin is dict:
        key, value = (type_name(a) for a in args) if args else ("key", "value")
        return f"map of {_plural(key)} to {_plural(value)}"
    if annotation in _TYPE_NAMES:
        return _TYPE_NAMES[annotation]
    raise ValueError(f"no words for the setting type {annotation!r}: add it to hack/docgen/settings.py")


def _plural(name: str) -> str:
    return name if name.startswith("one of") else name + "s"


def allowed(info: FieldInfo) -> str:
    """The field's constraints in words: ``> 0``, ``0 ≤ value ≤ 65535``, ``at least 1 item``."""
    lower = upper = ""
    words: list[str] = []
    for m in info.metadata:
        if isinstance(m, annotated_types.Gt):
            lower = f"{literal(m.gt)} <"
        elif isinstance(m, annotated_types.Ge):
            lower = f"{literal(m.ge)} ≤"
        elif isinstance(m, annotated_types.Lt):
            upper = f"< {literal(m.lt)}"
        elif isinstance(m, annotated_types.Le):
            upper = f"≤ {literal(m.le)}"
        elif isinstance(m, annotated_types.MinLen):
            words.append(f"at least {m.min_length} item{'s' if m.min_length != 1 else ''}")
        elif isinstance(m, annotated_types.MaxLen):
            words.append(f"at most {m.max_length} items")
    if lower and upper:
        words.insert(0, f"{lower} value {upper}")
    elif lower:  # "0 <" → "> 0", "0 ≤" → "≥ 0"
        bound, op = lower.rsplit(" ", 1)
        words.insert(0, f"{'>' if op == '<' else '≥'} {bound}")
    elif upper:
        words.insert(0, upper)
    return ", ".join(words)


FACTORY: Final = "computed at start (see above)"
"""The default of a key whose default comes from a factory (read from the environment)."""


def default(info: FieldInfo) -> str:
    """The default as YAML shows it; :data:`FACTORY` for a default computed at start."""
    if info.default_factory is not None:
        return FACTORY
    if info.default is PydanticUndefined:
        return "required"
    return literal(info.default)


def groups(root: type[BaseSettings]) -> list[Group]:
    """The root's own settings (key ``""``), then one group per nested model, in field order."""
    prefix = str(root.model_config.get("env_prefix", ""))
    delimiter = str(root.model_config.get("env_nested_delimiter", "__"))
    own: list[Setting] = []
    nested: list[Group] = []
    for name, info in root.model_fields.items():
        if _is_group(info):
            model = typing.cast("type[BaseModel]", info.annotation)
            rows = tuple(_rows(model, name, f"{prefix}{name}", delimiter))
            nested.append(Group(name, prose(model.__doc__ or ""), rows))
        else:
            own.append(_setting(name, f"{prefix}{name}".upper(), info))
    return [Group("", "", tuple(own)), *nested]


def _rows(model: type[BaseModel], path: str, env: str, delimiter: str) -> list[Setting]:
    """The settings of ``model`` at ``path``, a sub-group's (e.g. ``lease.standby``) flattened
    in place, each with its dotted path and environment variable."""
    rows: list[Setting] = []
    for key, info in model.model_fields.items():
        if _is_group(info):
            sub = typing.cast("type[BaseModel]", info.annotation)
            rows.extend(_rows(sub, f"{path}.{key}", f"{env}{delimiter}{key}", delimiter))
        else:
            rows.append(_setting(f"{path}.{key}", f"{env}{delimiter}{key}".upper(), info))
    return rows


def _setting(path: str, env: str, info: FieldInfo) -> Setting:
    return Setting(
        path=path,
        env=env,
        type=type_name(info.annotation),
        allowed=allowed(info),
        default=default(info),
        description=prose(info.description or ""),
    )


def missing_descriptions(root: type[BaseSettings]) -> list[str]:
    """Paths of the settings that have no ``Field(description=...)``."""
    return [s.path for g in groups(root) for s in g.settings if not s.description]


INTRO: Final = """\
# Settings

Both deployables, `flexlease-extender` and `flexlease-agent`, read one configuration: the
pydantic-settings root `flexlease.config.Settings`, with a group per component. Each key can be
given, highest first:

1. in the environment: `FLEXLEASE_` then the group and the key in capitals, joined by `__`
   (`FLEXLEASE_EXTENDER__PORT=8888`; a top-level key has no group: `FLEXLEASE_LOG_LEVEL`). Lists
   and sets are written as JSON (`FLEXLEASE_EXTENDER__TLS_CLIENT_NAMES='["flexlease-scheduler"]'`);
2. in a YAML file given by `--config FILE` or `$FLEXLEASE_CONFIG`, nested by group:

    ```yaml
    log_format: json
    store: {kind: kube}
    extender:
      port: 8888
      tls_client_names: [flexlease-scheduler]
    ```

3. otherwise the default below.

An unknown key in a group (in the file or the environment) or a value out of range stops the
process at start with a message naming the key (exit status 2). The manifests mount
`manifests/base/extender/config.yaml` as the extender's file (ConfigMap
`flexlease-extender-config`); the agent's DaemonSet sets environment variables.
"""


def render(root: type[BaseSettings]) -> str:
    """The whole page."""
    out = [GENERATED.format(source=SOURCE), "", INTRO]
    for group in groups(root):
        out += ["", f"## {code(group.key) if group.key else 'Top level'}", ""]
        if group.doc:
            out += [group.doc, ""]
        for s in group.settings:
            out += [f"### {code(s.path)}", "", s.description, ""]
            kind = f"{s.type}, {s.allowed}" if s.allowed else s.type
            shown = s.default if s.default in (FACTORY, "required") else code(s.default)
            out += [table(("type", "default", "environment"), [(kind, shown, code(s.env))]), ""]
    return "\n".join(out).rstrip("\n") + "\n"
