"""What Kubernetes allows in the names and values a request brings to flexlease.

Role: the rules of ``k8s.io/apimachinery/pkg/util/validation`` (validation.go) that the
extender checks at its boundary, before anything from a request becomes shared state
(issue #37): DNS-1123 subdomains (node, pod, controller and scheduler names; at most 253
characters), DNS-1123 labels (namespaces; at most 63), label values (at most 63), UIDs, and
``metav1.Time`` (RFC 3339) values. Each rule is given once, as a regular expression without
anchors (:class:`Rule`), and spelled as a constrained string type for the two validation
libraries on the request path: ``msgspec`` (``Meta(pattern=...)``: Python's :mod:`re`,
anchored with ``\\Z`` since its ``$`` also matches before a final newline) and pydantic
(``StringConstraints``: pydantic-core's Rust regex engine, where ``$`` is the end of the
text). Every rule is ASCII only, so a name that passes is valid UTF-8 and cannot hold
control, bidirectional or look-alike characters, nor differ from another only in case (upper
case is refused in names) or Unicode normalisation.

:func:`explain` rewrites a library's "does not match the pattern" message into the rule's
words, for error replies that name the field and say what it must be.

Pure; no I/O. Neighbours: :mod:`flexlease.api.wire` (the extender's request models) and
:mod:`flexlease.api.podfields` (the embedded Pod) use these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Final

import msgspec
from pydantic import StringConstraints


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``pattern`` (unanchored), ``max_length`` (characters; None: unbounded),
    ``empty`` (whether ``""`` passes) and ``words`` (what a value must be, for messages)."""

    pattern: str
    max_length: int | None
    words: str
    empty: bool = False

    @property
    def python(self) -> str:
        """The pattern anchored for Python's :mod:`re` (``re.search``, as msgspec uses it)."""
        body = f"(?:{self.pattern})?" if self.empty else f"(?:{self.pattern})"
        return f"^{body}\\Z"

    @property
    def rust(self) -> str:
        """The pattern anchored for pydantic-core's Rust regex engine."""
        body = f"(?:{self.pattern})?" if self.empty else f"(?:{self.pattern})"
        return f"^{body}$"


_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"

DNS1123_LABEL: Final = Rule(
    _LABEL,
    63,
    "a lowercase RFC 1123 label: at most 63 characters, lower case alphanumeric characters "
    "or '-', starting and ending with an alphanumeric character",
)
"""``IsDNS1123Label``: namespace names."""

DNS1123_SUBDOMAIN: Final = Rule(
    rf"{_LABEL}(?:\.{_LABEL})*",
    253,
    "a lowercase RFC 1123 subdomain: at most 253 characters, lower case alphanumeric "
    "characters, '-' or '.', starting and ending with an alphanumeric character",
)
"""``IsDNS1123Subdomain``: node, pod, controller and scheduler names."""

LABEL_VALUE: Final = Rule(
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?",
    63,
    "a valid label value: at most 63 characters, alphanumeric characters, '-', '_' or '.', "
    "starting and ending with an alphanumeric character",
    empty=True,
)
"""``IsValidLabelValue`` (the empty value is valid)."""

UID: Final = Rule(
    r"[A-Za-z0-9][-A-Za-z0-9_.:]*",
    128,
    "a UID: at most 128 characters, alphanumeric characters, '-', '_', '.' or ':', starting "
    "with an alphanumeric character (the API server writes RFC 4122 UUIDs)",
)
"""Object UIDs. apimachinery does not validate a UID's form (the API server makes it, a
UUID); this bound keeps any other text — control characters, megabytes — out of the
extender's lookups and logs."""

TIMESTAMP: Final = Rule(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})",
    64,
    "an RFC 3339 time, e.g. 2026-11-21T23:00:00Z (what metav1.Time reads)",
)
"""``metav1.Time`` as JSON (Go's ``time.RFC3339``, fractional seconds allowed)."""

RULES: Final = (DNS1123_LABEL, DNS1123_SUBDOMAIN, LABEL_VALUE, UID, TIMESTAMP)


def _msgspec(rule: Rule) -> msgspec.Meta:
    return msgspec.Meta(pattern=rule.python, max_length=rule.max_length)


def _pydantic(rule: Rule) -> StringConstraints:
    return StringConstraints(pattern=rule.rust, max_length=rule.max_length)


def or_empty(rule: Rule) -> Rule:
    """``rule``, with ``""`` also passing (a field whose empty value means "unset")."""
    return Rule(rule.pattern, rule.max_length, rule.words, empty=True)


# msgspec spellings (the extender's fast decoders)
NodeName = Annotated[str, _msgspec(DNS1123_SUBDOMAIN)]
Subdomain = Annotated[str, _msgspec(DNS1123_SUBDOMAIN)]
Namespace = Annotated[str, _msgspec(DNS1123_LABEL)]
UidOrEmpty = Annotated[str, _msgspec(or_empty(UID))]

# pydantic spellings (the extender's request models, flexlease.api.wire; the embedded Pod,
# flexlease.api.podfields)
NodeNameField = Annotated[str, _pydantic(DNS1123_SUBDOMAIN)]
SubdomainField = Annotated[str, _pydantic(DNS1123_SUBDOMAIN)]
SubdomainOrEmptyField = Annotated[str, _pydantic(or_empty(DNS1123_SUBDOMAIN))]
NamespaceField = Annotated[str, _pydantic(DNS1123_LABEL)]
LabelValueField = Annotated[str, _pydantic(LABEL_VALUE)]
UidField = Annotated[str, _pydantic(UID)]
UidOrEmptyField = Annotated[str, _pydantic(or_empty(UID))]
TimestampField = Annotated[str, _pydantic(TIMESTAMP)]


def _phrasings(rule: Rule) -> tuple[str, ...]:
    """How msgspec and pydantic quote ``rule``'s patterns in their messages."""
    out: list[str] = []
    for variant in (rule, or_empty(rule)):
        out.append(f"Expected `str` matching regex {variant.python!r}")
        out.append(f"String should match pattern '{variant.rust}'")
    return tuple(out)


def explain(message: str, rules: tuple[Rule, ...] = RULES) -> str:
    """``message`` (a msgspec or pydantic validation message) with the pattern of one of
    ``rules`` replaced by the rule's words, e.g. ``String should match pattern '^…$'`` →
    ``expected a lowercase RFC 1123 subdomain: …``. Other text is kept."""
    for rule in rules:
        for phrase in _phrasings(rule):
            if phrase in message:
                return message.replace(phrase, f"expected {rule.words}")
    return message
