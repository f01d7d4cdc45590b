"""The Kubernetes API calls a deployable's code can make, read from its source (no import, no run).

    python hack/api_calls.py [extender|nodeagent]

prints one line per ``group resource verb`` — what the deployable's Role must grant, no more
(``tests/manifests/test_rbac.py`` compares it with the Roles in ``manifests/``).

Every API call goes through the store seam (:class:`flexlease.store.base.Store`), whose methods
map one to one onto API verbs in :class:`flexlease.store.kube.KubeStore`: ``list``, ``watch``,
``get``, ``create``, ``patch`` (``subresource="status"``: the ``status`` subresource),
``delete``; ``bind`` = ``create pods/binding``; ``evict`` = ``create pods/eviction``. The scan:

* finds calls ``<…store>.<verb>(Kind.X, …)`` (the receiver's name ends in ``store``);
* a call whose kind is not a ``Kind.X`` literal (``store.list(self._kind)``) is a *template*
  of the function or class around it; the template takes the ``Kind.X`` passed where that
  function or class is called (``Informer(store, Kind.POD)``), flows through callers that pass
  a kind variable on (``Mirror`` → ``Informer``), and otherwise takes the ``Kind.X`` named
  elsewhere in its module (``WatchState(Kind.POD)`` beside ``list_and_watch``);
* counts the deployable's own modules whole, and the shared ``flexlease`` functions and
  classes only when the deployable refers to them (by import, transitively), so a helper it
  never uses adds nothing.

The scan is deliberately simple: :func:`scan` raises :class:`ScanError` for a kind template it
cannot resolve, rather than guessing. It sees only the store: code that calls the API server
directly (today only the orchestrator's ``pods/exec`` executor, which the extender runs only
with ``orchestrator.executor: kubernetes``) is listed in ``tests/manifests/test_rbac.py``'s
``STORE_BYPASSES``.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flexlease.store.base import Kind
from flexlease.store.kube_resources import RESOURCES

ROOT = Path(__file__).resolve().parent.parent
SHARED = "flexlease"
VERBS = {"list", "watch", "get", "create", "patch", "delete"}


class ScanError(Exception):
    """The source has a store call the scan cannot attribute to a kind."""


@dataclass(frozen=True, order=True)
class Grant:
    """One RBAC triple: ``group`` ("" = core), ``resource`` (``pods``, ``gpunodes/status``), ``verb``."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.group or 'core'} {self.resource} {self.verb}"


Op = tuple[str, str | None]  # (store method, subresource)
UnitKey = tuple[str, str]  # (module, top-level name)


@dataclass
class _Unit:
    key: UnitKey
    literal: set[tuple[Kind, str, str | None]] = field(default_factory=set)
    templates: set[Op] = field(default_factory=set)
    special: set[Grant] = field(default_factory=set)
    # (target, literal kinds passed, whether a kind variable is passed on)
    refs: list[tuple[UnitKey, frozenset[Kind], bool]] = field(default_factory=list)


def _kind_literal(node: ast.expr | None) -> Kind | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Kind"
        and node.attr in Kind.__members__
    ):
        return Kind[node.attr]
    return None


def _kindish(node: ast.expr) -> bool:
    """A variable that carries a kind: ``kind``, ``self._kind``, ``state.kind``."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lstrip("_") == "kind"


def _receiver(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _args(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def _store_kind_arg(call: ast.Call) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == "kind":
            return k.value
    return call.args[0] if call.args else None


def _subresource(call: ast.Call) -> str | None:
    for k in call.keywords:
        if k.arg == "subresource" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str):
            return k.value.value
    return None


class _Module:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.defs = {
            n.name: n
            for n in self.tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        self.imports: dict[str, UnitKey] = {}
        for n in self.tree.body:
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                for alias in n.names:
                    self.imports[alias.asname or alias.name] = (n.module, alias.name)
        self.kinds = {k for n in ast.walk(self.tree) if isinstance(n, ast.expr) and (k := _kind_literal(n))}

    def resolve(self, func: ast.expr) -> UnitKey | None:
        base = func
        while isinstance(base, ast.Attribute):
            base = base.value
        if not isinstance(base, ast.Name):
            return None
        if base.id in self.defs:
            return (self.name, base.id)
        return self.imports.get(base.id)


def _unit(module: _Module, node: ast.stmt) -> _Unit:
    unit = _Unit((module.name, getattr(node, "name", "")))
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        if isinstance(func, ast.Attribute) and _receiver(func.value).endswith("store"):
            if func.attr == "bind":
                unit.special.add(Grant("", "pods/binding", "create"))
                continue
            if func.attr == "evict":
                unit.special.add(Grant("", "pods/eviction", "create"))
                continue
            if func.attr in VERBS:
                arg = _store_kind_arg(call)
                kind = _kind_literal(arg)
                if kind is not None:
                    unit.literal.add((kind, func.attr, _subresource(call)))
                    continue
                if arg is not None:
                    unit.templates.add((func.attr, _subresource(call)))
                    continue
        target = module.resolve(func)
        if target is not None and target != unit.key:
            args = _args(call)
            kinds = frozenset(k for a in args if (k := _kind_literal(a)) is not None)
            unit.refs.append((target, kinds, any(_kindish(a) for a in args)))
    return unit


def _modules(package: str, root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted((root / package).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path


def scan(package: str, root: Path = ROOT) -> set[Grant]:
    """The grants ``package`` (``extender`` or ``nodeagent``, a directory under ``root``)
    needs, with the shared ``flexlease`` package beside it. Raises :class:`ScanError` when a
    kind template resolves to no kind, ``SyntaxError`` on unparsable source."""
    modules = {name: _Module(name, path) for pkg in {package, SHARED} for name, path in _modules(pkg, root)}
    units = {(m.name, name): _unit(m, node) for m in modules.values() for name, node in m.defs.items()}
    own = {k for k in units if k[0] == package or k[0].startswith(package + ".")}
    reachable, todo = set(own), list(own)
    while todo:
        for target, _, _ in units[todo.pop()].refs:
            if target in units and target not in reachable:
                reachable.add(target)
                todo.append(target)
    # A caller that passes a kind variable on inherits the callee's templates.
    templates = {k: set(units[k].templates) for k in reachable}
    changed = True
    while changed:
        changed = False
        for k in reachable:
            for target, _, passes in units[k].refs:
                if passes and target in templates and not templates[target] <= templates[k]:
                    templates[k] |= templates[target]
                    changed = True
    calls: set[tuple[Kind, str, str | None]] = set()
    grants: set[Grant] = set()
    bound: set[UnitKey] = set()
    for k in reachable:
        unit = units[k]
        calls |= unit.literal
        grants |= unit.special
        for target, kinds, passes in unit.refs:
            if target in templates and (kinds or passes):
                bound.add(target)
                calls |= {(kind, verb, sub) for kind in kinds for verb, sub in templates[target]}
    for k in sorted(reachable):
        if templates[k] and k not in bound:
            near = modules[k[0]].kinds
            if not near:
                raise ScanError(f"{k[0]}.{k[1]}: store calls with a kind variable and no kind to bind it")
            calls |= {(kind, verb, sub) for kind in near for verb, sub in templates[k]}
    for kind, verb, sub in calls:
        res = RESOURCES[kind]
        grants.add(Grant(res.group, f"{res.plural}/{sub}" if sub else res.plural, verb))
    return grants


def format_grants(grants: Iterable[Grant]) -> str:
    return "\n".join(str(g) for g in sorted(grants))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="*", default=["extender", "nodeagent"])
    for package in parser.parse_args().package:
        print(f"# {package}")
        print(format_grants(scan(package)))


if __name__ == "__main__":
    main()
