"""The metrics reference (``docs/reference/metrics.md``) from the metric definitions.

Every Prometheus metric flexlease defines, found in the source of the production packages
(``extender``, ``nodeagent``, ``flexlease``): each call of a prometheus-client class (``Counter``,
``Gauge``, ``Histogram``… and the ``*MetricFamily`` classes of custom collectors), imported from
``prometheus_client``, with its name, help text and label names resolved from literals and the
module's own constants (``PREFIX + "gpu_health"``, ``labels=[*GPU_LABELS, "state"]``). A metric
whose name or labels cannot be resolved this way stops the generator (:class:`Unresolved`), so a
new metric is never left out silently. Names are shown as exposed: a counter's with ``_total``.
Pure: reads source text.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hack.docgen.text import GENERATED, cell, code, table

SOURCE: Final = "the metric definitions in extender/, nodeagent/ and flexlease/"
PACKAGES: Final = ("extender", "nodeagent", "flexlease")
DEPLOYABLES: Final[Mapping[str, str]] = {
    "extender": "Extender (`flexlease-extender`, `/metrics` on `extender.metrics_port`)",
    "nodeagent": "Node agent (`flexlease-agent`, `/metrics` on `agent.metrics_port`)",
    "flexlease": "Shared package",
}

TYPES: Final[Mapping[str, str]] = {
    "Counter": "counter",
    "Gauge": "gauge",
    "Histogram": "histogram",
    "Summary": "summary",
    "Info": "info",
    "Enum": "stateset",
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
    "SummaryMetricFamily": "summary",
    "InfoMetricFamily": "info",
    "StateSetMetricFamily": "stateset",
    "GaugeHistogramMetricFamily": "gaugehistogram",
}
"""prometheus-client's metric classes and the type each exposes."""

_FAMILY_LABELS_AT: Final = 3
"""``XMetricFamily(name, documentation, value, labels)``: where a family's labels may stand."""
_WRAPPER_LABELS_AT: Final = 2
"""``Counter(name, documentation, labelnames)``."""


class Unresolved(ValueError):
    """A metric definition whose name, help text or labels are not literals or module constants."""


@dataclass(frozen=True)
class MetricDoc:
    """One metric: the ``name`` it is exposed under, its ``type``, ``labels``, ``help`` text,
    and the ``module`` (dotted) that defines it."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    module: str

    @property
    def deployable(self) -> str:
        return self.module.split(".", 1)[0]


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module's top-level names bound to a value that resolves (strings, tuples, …)."""
    found: dict[str, object] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            with contextlib.suppress(Unresolved):  # not a constant a metric could use
                found[target.id] = _evaluate(value, found)
    return found


def _evaluate(node: ast.expr, names: Mapping[str, object]) -> object:
    """A literal, a known constant, ``a + b`` of those, or a list/tuple with starred constants."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _evaluate(node.left, names), _evaluate(node.right, names)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
    if isinstance(node, ast.List | ast.Tuple):
        items: list[object] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                inner = _evaluate(element.value, names)
                if not isinstance(inner, tuple | list):
                    raise Unresolved(ast.unparse(element))
                items += inner
            else:
                items.append(_evaluate(element, names))
        return tuple(items)
    raise Unresolved(ast.unparse(node))


def _metric_classes(tree: ast.Module) -> dict[str, str]:
    """Local name → prometheus-client class name, from the module's imports."""
    classes: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "prometheus_client":
            for alias in node.names:
                if alias.name in TYPES:
                    classes[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "prometheus_client":
                    classes[alias.asname or alias.name] = "<module>"
    return classes


def _class_of(call: ast.Call, classes: Mapping[str, str]) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        name = classes.get(func.id)
        return name if name in TYPES else None
    if isinstance(func, ast.Attribute) and func.attr in TYPES:
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and classes.get(root.id) == "<module>":
            return func.attr
    return None


def _argument(call: ast.Call, keyword: str, position: int) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        return call.args[position]
    return None


def exposed_name(name: str, kind: str) -> str:
    """The name a metric is exposed under: a counter's ends in ``_total`` (prometheus-client
    strips a given ``_total`` and adds it back)."""
    if kind == "counter":
        return name.removesuffix("_total") + "_total"
    return name


def scan(source: str, module: str) -> list[MetricDoc]:
    """The metrics defined in one module's ``source``. Raises :class:`Unresolved`."""
    tree = ast.parse(source)
    classes = _metric_classes(tree)
    if not classes:
        return []
    names = _constants(tree)
    out: list[MetricDoc] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        cls = _class_of(node, classes)
        if cls is None:
            continue
        where = f"{module}:{node.lineno}"
        family = cls.endswith("MetricFamily")
        parts = {
            "name": _argument(node, "name", 0),
            "documentation": _argument(node, "documentation", 1),
            "labels": _argument(
                node,
                "labels" if family else "labelnames",
                _FAMILY_LABELS_AT if family else _WRAPPER_LABELS_AT,
            ),
        }
        values: dict[str, object] = {}
        for key, expr in parts.items():
            if expr is None:
                values[key] = () if key == "labels" else None
                continue
            try:
                values[key] = _evaluate(expr, names)
            except Unresolved as exc:
                raise Unresolved(
                    f"{where}: {cls} {key} is not a literal or a module constant: {exc}"
                ) from None
        name, doc, labels = values["name"], values["documentation"], values["labels"]
        if not isinstance(name, str) or not isinstance(doc, str) or not isinstance(labels, tuple):
            raise Unresolved(f"{where}: {cls} needs a literal name, help text and label list")
        kind = TYPES[cls]
        out.append(MetricDoc(exposed_name(name, kind), kind, tuple(map(str, labels)), doc, module))
    return out


def collect(root: Path, packages: Iterable[str] = PACKAGES) -> list[MetricDoc]:
    """Every metric defined under ``root/<package>`` (generated ``*_pb2*`` modules skipped),
    sorted by name. Raises :class:`Unresolved`, or ``ValueError`` when two definitions of one
    name differ."""
    found: dict[str, MetricDoc] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for metric in scan(path.read_text(encoding="utf-8"), module):
                known = found.setdefault(metric.name, metric)
                if (known.type, known.labels) != (metric.type, metric.labels):
                    raise ValueError(f"{metric.name} is defined twice, differently: {known} and {metric}")
    return sorted(found.values(), key=lambda m: m.name)


INTRO: Final = """\
# Metrics

Every metric flexlease exports, with the prefix `flexlease_`, as Prometheus scrapes it. The
extender serves them on `GET /metrics` (with `extender.metrics_port` set, on that plain-HTTP
listener; the manifests use 9401) and the node agent on `agent.metrics_port` (9400). Label values
are bounded (verbs, outcomes, tiers, GPU models, node names, GPU indices), never pod names or
UIDs. The extender also exports prometheus-client's `process_*`, `python_info` and `python_gc_*`
families. Histograms add the series `_bucket`, `_sum` and `_count`. The alerts built on these are
in `manifests/alerts/rules.yaml` ([operations](../operations.md)).
"""


def render(metrics: Iterable[MetricDoc]) -> str:
    """The whole page: one table per deployable."""
    out = [GENERATED.format(source=SOURCE), "", INTRO]
    by_deployable: dict[str, list[MetricDoc]] = {}
    for metric in metrics:
        by_deployable.setdefault(metric.deployable, []).append(metric)
    for deployable in PACKAGES:
        members = by_deployable.get(deployable)
        if not members:
            continue
        out += ["", f"## {DEPLOYABLES[deployable]}", ""]
        rows = [
            (
                code(m.name),
                m.type,
                ", ".join(code(label) for label in m.labels) or "–",
                cell(m.help),
                code(m.module),
            )
            for m in members
        ]
        out += [table(("metric", "type", "labels", "meaning", "defined in"), rows), ""]
    return "\n".join(out).rstrip("\n") + "\n"
