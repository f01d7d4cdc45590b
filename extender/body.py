"""Request bodies: bytes → JSON values, with the extender's limits, and a fast path for the
``ExtenderArgs`` kube-scheduler sends on every scheduling cycle.

Role: every verb reads a JSON body. :func:`decode` accepts exactly what the reference
decoder (:mod:`json` with an integer hook) accepts, within :data:`MAX_JSON_DEPTH`,
:data:`MAX_JSON_INT_DIGITS` and :data:`JSON_INT_RANGE`, and only text that is valid Unicode
(no lone UTF-16 surrogate escape: such a string cannot be written back as UTF-8, by orjson
or by any Go client); it raises :class:`BodyError` (a 400 for the server) otherwise, naming
the offending member. :class:`ExtenderArgsDecoder` serves ``/filter`` and ``/prioritize``: kube-scheduler
sends the same pod to both and, with ``nodeCacheCapable``, mostly the same ``NodeNames``
list cycle after cycle, so it splits the envelope at its tail, as Go's encoding/json writes
it (:func:`_split`: the pod and the node list kept as raw JSON, unparsed), and decodes each
part only when its bytes differ from a recent request's. A node list it must decode comes
out as the filter cache's own name strings (:meth:`ExtenderArgsDecoder.intern`) when every
name is known. Anything not in that exact shape goes the general way, so replies and errors
do not depend on which path a body took. Nothing from a request is kept unless it passed
Kubernetes' rules (issue #37): a node list only when every name is a DNS-1123 subdomain
(:data:`flexlease.api.names.NodeName`), a pod only when its read fields pass
:func:`flexlease.api.podfields.check_pod`, and :meth:`ExtenderArgsDecoder.intern` builds its
decoder over valid names only.

:func:`decode_binding_args` is the same idea for ``/bind``'s ``ExtenderBindingArgs``: four
strings, decoded and checked by ``msgspec`` in one pass into a struct instead of the general
decoder and the pydantic model.

Pure, no I/O. Neighbours: :mod:`extender.server` calls it; :mod:`flexlease.api.wire` holds
the models.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import msgspec
import orjson

from flexlease.api import names as k8snames
from flexlease.api import podfields
from flexlease.errors import PodSpecError
from flexlease.jsontext import has_long_digits

MAX_JSON_DEPTH: Final = 100
"""Deepest nesting of objects and arrays accepted in a request body. Pods, NodeLists and
the extender envelopes nest about 15 deep (managedFields included)."""
MAX_JSON_INT_DIGITS: Final = 20
"""Longest integer literal accepted: Kubernetes integers are int64 (19 digits and a sign)."""
JSON_INT_RANGE: Final = (-(2**63), 2**64 - 1)
"""Integers accepted: int64 and uint64 (what Go decodes and orjson encodes back; a larger
one in a member the extender echoes, such as a ``Nodes`` item, could not be answered)."""

_CONTAINERS: Final = (dict, list)


class BodyError(ValueError):
    """A body that is not acceptable JSON; ``reason`` is the short label counted in metrics
    (``too_deep``, ``bad_json``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _json_int(text: str) -> int:
    """``parse_int`` hook: refuse integer literals longer than any Kubernetes integer, or
    outside :data:`JSON_INT_RANGE`."""
    if len(text) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"integer literal of {len(text)} digits (at most {MAX_JSON_INT_DIGITS})")
    value = int(text)
    if not JSON_INT_RANGE[0] <= value <= JSON_INT_RANGE[1]:
        raise ValueError(f"integer {text} is outside the 64-bit range")
    return value


def _path(steps: list[str | int]) -> str:
    """A member's path for messages (``NodeNames[1]``, ``Pod.metadata.labels["k"]``)."""
    return podfields.location("", tuple(steps)) or "<body>"


def _not_unicode(value: Any) -> str | None:
    """The path of the first string (member value or key) in the decoded JSON ``value`` that
    is not valid Unicode (a lone surrogate from a ``\\uD800``-style escape), else None.
    Iterative; called only for bodies the reference decoder read."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:  # depth first, in document order (children pushed last first)
        node, steps = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and not _encodable(node):
                return _path(steps)
        elif isinstance(node, dict):
            for k in node:
                if not k.isascii() and not _encodable(k):
                    return _path([*steps, k])  # shown escaped (ascii())
            stack.extend((v, [*steps, k]) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((node[i], [*steps, i]) for i in range(len(node) - 1, -1, -1))
    return None


def _encodable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_REFERENCE: Final = json.JSONDecoder(parse_int=_json_int)
"""The reference decoder (built once: ``json.loads`` with a hook would build one per call).
Bodies go through :func:`orjson.loads` first (several times faster); a body it refuses
(``NaN``, lone surrogates), and one that may hold an integer outside 64 bits, is decoded
here instead, so both accept exactly what this one accepts and errors read the same
(:func:`flexlease.jsontext.has_long_digits`)."""


def json_depth(obj: Any, *, stop_above: int | None = None) -> int:
    """Deepest nesting of objects/arrays in the parsed JSON value ``obj`` (a scalar is 0,
    ``[]`` is 1); returns early, with a value above ``stop_above``, once that is exceeded.
    Iterative; only containers are visited in Python (scalars are skipped in C)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)] if isinstance(obj, _CONTAINERS) else []
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if stop_above is not None and deepest > stop_above:
                break
        values = node.values() if isinstance(node, dict) else node
        for child in itertools.compress(values, map(isinstance, values, itertools.repeat(_CONTAINERS))):
            stack.append((child, depth + 1))
    return deepest


def too_deep(text: str | bytes, value: Any, *, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed from ``text``) nests deeper than ``limit``. A text with no
    more opening brackets than that cannot, and is not walked (the usual case)."""
    if isinstance(text, bytes):
        if text.count(b"{") + text.count(b"[") <= limit:
            return False
    elif text.count("{") + text.count("[") <= limit:
        return False
    return json_depth(value, stop_above=limit) > limit


def decode(raw: bytes) -> Any:
    """``raw`` as a JSON value. Raises :class:`BodyError` on a body that is not UTF-8 JSON,
    nests deeper than :data:`MAX_JSON_DEPTH` or holds an integer literal longer than
    :data:`MAX_JSON_INT_DIGITS`."""
    deep = f"JSON body nests deeper than {MAX_JSON_DEPTH} levels"
    if not has_long_digits(raw):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if too_deep(raw, value):
                raise BodyError("too_deep", deep)
            return value
    try:
        text = raw.decode("utf-8")
        value = _REFERENCE.decode(text)
    except RecursionError as exc:
        raise BodyError("too_deep", deep) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, _json_int
        raise BodyError("bad_json", f"malformed JSON body: {exc}") from exc
    if too_deep(text, value):
        raise BodyError("too_deep", deep)
    if "\\u" in text and (where := _not_unicode(value)) is not None:  # only escapes make surrogates
        raise BodyError(
            "bad_string",
            f"{where}: a string that is not valid Unicode (a lone UTF-16 surrogate escape such as \\ud800)",
        )
    return value


_HEAD: Final = b'{"Pod":'
_TAIL: Final = b',"Nodes":null,"NodeNames":'
"""The envelope around the pod and the node list, as encoding/json writes it."""
_NAMES: Final = msgspec.json.Decoder(list[k8snames.NodeName])
"""A ``NodeNames`` array: node names as Kubernetes allows them (DNS-1123 subdomains)."""
_NODE_NAME: Final = re.compile(k8snames.DNS1123_SUBDOMAIN.python)


def _literal(values: tuple[str, ...]) -> Any:
    """``Literal[values]``, made afresh. ``typing`` memoises ``Literal[...]`` by equality (an
    LRU of 128 entries), so the usual spelling may hand back an older alias holding older,
    equal string objects, and would keep up to 128 node lists (with msgspec's lookup table
    on each) alive; the undecorated builder behind it is used when it is there."""
    build = getattr(getattr(Literal, "_getitem", None), "__wrapped__", None)
    if build is None:  # another Python's typing: the memoised spelling, still correct
        return cast(Any, Literal)[values]
    return build(Literal, *values)


@dataclass(frozen=True, slots=True)
class CandidateArgs:
    """``ExtenderArgs`` of a ``nodeCacheCapable`` scheduler (``Nodes`` null) as
    :class:`ExtenderArgsDecoder` decodes it: the attributes of
    :class:`flexlease.api.wire.ExtenderArgs` that the verbs read, without the pydantic model
    (its ``model_construct`` costs about 2 µs a request with warm caches)."""

    pod: dict[str, Any]
    node_names: list[str]
    nodes: None = None

    def candidate_names(self) -> list[str]:
        """A copy of ``NodeNames`` (as :meth:`flexlease.api.wire.ExtenderArgs.candidate_names`)."""
        return list(self.node_names)


def _split(raw: bytes) -> tuple[bytes, bytes] | None:
    """(the pod's text, the ``NodeNames`` text) when ``raw`` reads ``{"Pod":`` text
    ``,"Nodes":null,"NodeNames":`` text ``}``, split at the last such tail, else None. Go's
    encoding/json writes ``ExtenderArgs`` so (no spaces, fields in declaration order), and
    ``NodeNames`` (an array of strings, whose quotes inside are escaped) cannot hold the tail,
    so the last one is the envelope's own. The split stands only when both parts decode on
    their own, the pod as a JSON object (:meth:`ExtenderArgsDecoder._pod`) and the list as
    an array of strings (:meth:`ExtenderArgsDecoder._names`): then the body is exactly that
    object with those three members, by JSON's unambiguous grammar. (A ``msgspec`` struct
    of raw members, used before, also scanned every byte of the pod to find its end, and
    answered bodies the general path refuses: unknown members, which the general path
    matches to fields case-insensitively as Go does, and a member given twice whose first
    value holds a too-long integer.)"""
    if not raw.startswith(_HEAD) or not raw.endswith(b"]}"):
        return None
    at = raw.rfind(_TAIL)
    if at <= len(_HEAD):
        return None
    return raw[len(_HEAD) : at], raw[at + len(_TAIL) : -1]


class ExtenderArgsDecoder:
    """Decode ``ExtenderArgs`` bodies, reusing the pods and node lists of recent requests.
    Only a pod whose read fields pass :func:`flexlease.api.podfields.check_pod`, and a node
    list of valid node names, is decoded here and kept; any other body goes the general way.

    ``pods`` and ``lists``: how many distinct pod texts and ``NodeNames`` texts are kept
    (least recently used dropped). Pods are kept decoded: callers must not change the
    ``pod`` dict (nor the ``node_names`` list) of a returned :class:`CandidateArgs` (none
    does; the verbs only read). ``hits``/``misses`` count parts reused or decoded.
    """

    def __init__(self, *, pods: int = 64, lists: int = 8) -> None:
        if pods < 1 or lists < 1:
            raise ValueError("pods and lists must be at least 1")
        self._pods: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
        self._lists: list[tuple[bytes, list[str]]] = []
        """Kept ``NodeNames`` texts and their names, least recently used first. Found by
        comparing bytes (:meth:`_find`), never by hashing a text: a filter's list is ≈ 16 KiB
        at 1,250 nodes, and kube-scheduler's lists differ from cycle to cycle."""
        self._max_pods = pods
        self._max_lists = lists
        self._interned: tuple[list[str], msgspec.json.Decoder[list[str]]] | None = None
        """The names given to :meth:`intern` and a decoder of lists drawn from them."""
        self.hits = 0
        self.misses = 0

    def intern(self, names: list[str]) -> None:
        """Decode later ``NodeNames`` into these very string objects wherever a list holds
        only names from ``names`` (distinct; kept, not copied: the caller must not change
        it). The filter cache passes its universe (:attr:`extender.equivalence.FilterCache.universe`):
        its index then finds each candidate by identity, with the string's hash already
        computed, instead of hashing and comparing a fresh string per candidate (about half
        of a filter's per-candidate cost at 1,250 nodes, mostly cache misses).

        A list with any other name is decoded as before, into new strings; the answer is
        the same either way. Given the same list object again, this does nothing; a new one
        builds a ``msgspec`` decoder of ``list[Literal[*names]]`` (≈ 2 ms per 1,000 names,
        once per change of the universe: a node joining or leaving). Only the names that are
        valid node names (DNS-1123 subdomains) are given to it: the universe also holds the
        store's GPUNode names, which an API server checks but a test store need not, and a
        list with any other name is decoded and checked as a list of new strings, so both
        decoders accept the same lists."""
        if self._interned is not None and self._interned[0] is names:
            return
        valid = tuple(filter(_NODE_NAME.search, names))  # the universe may hold a store's odd name
        if not valid:
            self._interned = None
            return
        choices = _literal(valid)
        self._interned = (names, msgspec.json.Decoder(list[choices]))  # type: ignore[valid-type]

    def clear(self) -> None:
        """Forget every kept pod and node list and the interned names (after a failed
        request: :func:`extender.server.forget_request_state`); counters are kept."""
        self._pods.clear()
        self._lists.clear()
        self._interned = None

    def decode(self, raw: bytes) -> CandidateArgs | None:
        """The args in ``raw``, or None when ``raw`` is not in the exact shape (then decode
        it with :func:`decode` and validate it with the model, for the same answer and errors)."""
        split = _split(raw)
        if split is None:
            return None
        pod = self._pod(split[0])
        if pod is None:
            return None
        names = self._known(split[1])
        if names is None:
            names = self._names(split[1])
            if names is None:
                return None
        return CandidateArgs(pod, names)

    def announce(self, text: bytes, names: list[str]) -> None:
        """Keep ``names`` as the decoding of ``text``, which must be their JSON array (as
        :func:`orjson.dumps` writes it), without decoding it: the extender announces the
        ``NodeNames`` of each filter reply, which kube-scheduler sends back to
        ``/prioritize`` when no other filter or extender removes a node, so that body's
        list is found among the kept ones (:meth:`_known`) and its names are the filter's
        own strings. ``names`` is kept: the caller must not change it."""
        self._keep(text, names)

    def _find(self, text: bytes) -> int | None:
        """The position of ``text`` among the kept lists, most recent first; None when not
        kept. Compares bytes (lengths first, then the contents), never hashes them: the node
        list is most of a filter body (≈ 16 KiB of 17 at 1,250 nodes)."""
        kept = self._lists
        for i in range(len(kept) - 1, -1, -1):
            if kept[i][0] == text:
                return i
        return None

    def _keep(self, text: bytes, names: list[str]) -> None:
        """Keep ``text`` → ``names`` as the most recently used list (once)."""
        kept = self._lists
        i = self._find(text)
        if i is not None:
            del kept[i]
        kept.append((text, names))
        if len(kept) > self._max_lists:
            del kept[0]

    def _known(self, text: bytes) -> list[str] | None:
        """The names of ``text`` when it is a kept list (now the most recent one), else None."""
        i = self._find(text)
        if i is None:
            return None
        kept = self._lists
        if i != len(kept) - 1:
            kept.append(kept.pop(i))
        self.hits += 1
        return kept[-1][1]

    def _names(self, text: bytes) -> list[str] | None:
        """The names in ``text`` (a ``NodeNames`` array not kept), decoded and kept for later
        bodies; None when it is not an array of strings."""
        names = None
        if self._interned is not None:
            # the interned strings themselves, when every name is one of them
            with contextlib.suppress(msgspec.MsgspecError, UnicodeDecodeError):
                names = self._interned[1].decode(text)
        if names is None:
            try:
                names = _NAMES.decode(text)
            except (msgspec.MsgspecError, UnicodeDecodeError):  # not a list of strings: the general way
                return None
        self.misses += 1
        self._keep(text, names)
        return names

    def _pod(self, text: bytes) -> dict[str, Any] | None:
        pod = self._pods.get(text)
        if pod is not None:
            self._pods.move_to_end(text)
            self.hits += 1
            return pod
        if has_long_digits(text):
            return None  # an integer orjson would read as a float, perhaps: the general way
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:  # the reference decoder decides: the general way
            return None
        # The envelope adds one level: the pod may nest one less than a whole body.
        if not isinstance(value, dict) or too_deep(text, value, limit=MAX_JSON_DEPTH - 1):
            return None
        try:
            podfields.check_pod(value)
        except PodSpecError:  # not kept: the general way answers it, naming the field
            return None
        self.misses += 1
        self._pods[text] = value
        if len(self._pods) > self._max_pods:
            self._pods.popitem(last=False)
        return value


class BindingArgs(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    rename={"pod_name": "PodName", "pod_namespace": "PodNamespace", "pod_uid": "PodUID", "node": "Node"},
):
    """``ExtenderBindingArgs`` exactly as kube-scheduler's encoding/json writes it: the four
    Go field names and nothing else (a key in another case or an unknown one goes the
    general way, where keys are matched case-insensitively, as Go does), the constraints and
    the attribute names of :class:`flexlease.api.wire.ExtenderBindingArgs` (Kubernetes' rules
    for pod, namespace and node names and UIDs: :mod:`flexlease.api.names`). Made by
    ``msgspec`` without the pydantic model (whose ``model_construct`` alone costs ten times
    the decoding)."""

    pod_name: k8snames.Subdomain
    pod_namespace: k8snames.Namespace
    pod_uid: k8snames.UidOrEmpty
    node: k8snames.NodeName


_BINDING_ARGS: Final = msgspec.json.Decoder(BindingArgs)


def decode_binding_args(raw: bytes) -> BindingArgs | None:
    """The ``/bind`` args in ``raw``, or None when ``raw`` is not exactly a JSON object of the
    four string fields (then :func:`decode` and the model answer, with their errors). A key
    given twice keeps its last value, as in the general way."""
    try:
        return _BINDING_ARGS.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None
