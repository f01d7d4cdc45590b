"""Kubernetes resource quantities (``k8s.io/apimachinery/pkg/api/resource.Quantity``).

kube-scheduler forwards pods as the API server stores them, so a GPU count arrives in
Go's canonical form: ``"2"``, but ``"2k"`` for 2,000 and ``"1000m"`` never (canonical
forms carry the largest exact suffix). This module reads every form the API server
accepts and nothing else. The grammar (quantity.go, ``ParseQuantity`` and its scanner
``parseQuantityString``; suffixes from suffix.go)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <sign>            ::= "+" | "-"
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <digit>           ::= 0 | 1 | ... | 9                       (ASCII only)
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

As in Go: JSON ``UnmarshalJSON`` trims surrounding whitespace first; the scanner also takes
a bare sign or ``.`` (as 0) and ``1.`` with a suffix; a non-zero value is rounded up (away
from zero) to a whole number of nano units (``1e-12`` reads as ``1n``). Rejected, as the
API server rejects them: digit separators (``1_000``), non-ASCII digits (``１``), unknown
or miscased suffixes (``1K``, ``1mi``), an empty exponent (``1e``), ``NaN``/``Inf``.

Why not a library: kubernetes_asyncio (our client) ships no quantity parser, and the one in
the synchronous ``kubernetes`` client (``kubernetes.utils.quantity.parse_quantity``) hands
the number to :class:`decimal.Decimal`, which takes ``1_000``, ``NaN``, non-ASCII digits and
``1K``. The grammar is one regular expression; the value is exact integer arithmetic.

Pure; no I/O.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from fractions import Fraction
from typing import Final

NANO: Final = 10**9
"""Nano units per unit: Go rounds non-zero quantities up to a whole number of these."""

LIMIT: Final = 2**63
"""Magnitudes beyond ``2**63`` (Go's int64 range, far above any count of devices) are
clamped to it: ``1e999999999`` means "more than exists" without computing the number."""

_QUANTITY: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DIGITS_LIMIT: Final = 19
"""Integer digits above which a magnitude exceeds :data:`LIMIT` (``10**19 > 2**63``): clamped."""
_TINY: Final = 30
"""A value below ``10**-30`` is under one nano unit even times ``2**60`` (Ei): it reads as 1n."""
_SIGNIFICANT: Final = 64
"""Significant digits kept exactly (more than the 19 + 9 + 19 that can reach a nano unit)."""


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float | Decimal) -> Fraction:
    """The exact value of a quantity, as the API server reads it.

    ``value``: the JSON value — a string, or a JSON number (the API server accepts those
    too) as :class:`int`, :class:`float` or :class:`Decimal`. Returns a :class:`Fraction`,
    rounded up to whole nano units when non-zero and clamped to ``±2**63``. Raises
    :class:`QuantityError` when ``value`` is not a quantity (wrong type included).
    """
    if isinstance(value, bool):
        raise QuantityError(f"{_show(value)} is not a quantity")
    if isinstance(value, int):
        return Fraction(max(-LIMIT, min(LIMIT, value)))
    if isinstance(value, float | Decimal):
        value = repr(value) if isinstance(value, float) else str(value)
    if not isinstance(value, str):
        raise QuantityError(f"{_show(value)} is not a quantity")
    return _parse_text(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """:func:`parse_quantity` of a string, memoised: a cluster's pods repeat a handful of
    quantities (``"1"``, ``"16"``, ``"128Gi"``) and every verb parses each pod's requests
    (errors are raised, not cached)."""
    text = value.strip()
    m = _QUANTITY.fullmatch(text) if text else None
    if m is None:
        raise QuantityError(
            f"{_show(value)} is not a quantity (expected e.g. '2', '2k', '500m', '1Gi' or '1e3')"
        )
    negative = m["sign"] == "-"
    suffix = m["suffix"] or ""
    digits = (m["int"] or "") + (m["frac"] or "")
    exponent = -len(m["frac"] or "")
    if suffix in _DECIMAL:
        exponent += _DECIMAL[suffix]
        multiplier = 1
    elif suffix in _BINARY:
        multiplier = 1 << _BINARY[suffix]
    else:  # e<int> / E<int>: Go reads the exponent with strconv.ParseInt(s, 10, 64)
        exponent += _exponent(suffix[1:], value)
        multiplier = 1
    nanos = _nanos(digits, exponent, multiplier)
    return Fraction(-nanos if negative else nanos, NANO)


def _show(value: object) -> str:
    """``repr(value)``, cut to 40 characters for error messages."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def _exponent(text: str, value: object) -> int:
    """A signed decimal exponent in int64 range, as ``strconv.ParseInt(text, 10, 64)`` reads it."""
    negative = text.startswith("-")
    mag = text.lstrip("+-").lstrip("0") or "0"
    if len(mag) > 19 or int(mag) > 2**63 - (0 if negative else 1):
        raise QuantityError(f"{_show(value)}: exponent out of range")
    return -int(mag) if negative else int(mag)


def _nanos(digits: str, exponent: int, multiplier: int) -> int:
    """``ceil(int(digits) * 10**exponent * multiplier)`` in nano units, clamped to
    ``LIMIT * NANO``; exact to :data:`_SIGNIFICANT` significant digits (beyond them the value
    only decides the round-up, which is then certain)."""
    sig = digits.lstrip("0")
    if not sig.rstrip("0"):
        return 0
    magnitude = len(sig) + exponent  # the value lies in [10**(magnitude-1), 10**magnitude)
    if magnitude > _DIGITS_LIMIT:
        return LIMIT * NANO
    if magnitude < -_TINY:  # far below one nano unit even with the largest multiplier
        return 1
    sticky = False
    if len(sig) > _SIGNIFICANT:
        exponent += len(sig) - _SIGNIFICANT
        sticky = bool(sig[_SIGNIFICANT:].strip("0"))
        sig = sig[:_SIGNIFICANT]
    x = Fraction(int(sig) * multiplier) * Fraction(10) ** (exponent + 9)
    nanos = x.numerator // x.denominator
    if sticky or x.denominator != 1:
        nanos += 1
    return min(nanos, LIMIT * NANO)


def integer_quantity(value: str | int | float | Decimal) -> int:
    """A quantity of an integer resource (extended resources such as ``nvidia.com/gpu``):
    the API server accepts only whole, non-negative values (``1000m`` is 1, ``1500m`` is
    refused). Returns the count, clamped to ``2**63``. Raises :class:`QuantityError` when
    ``value`` is not a quantity, is negative or is not whole."""
    if isinstance(value, str):
        return _integer_text(value)
    return _whole(value, parse_quantity(value))


@functools.lru_cache(maxsize=4096)
def _integer_text(value: str) -> int:
    """:func:`integer_quantity` of a string, memoised as :func:`_parse_text` is: every parse
    of a pod counts its GPUs (errors are raised, not cached)."""
    return _whole(value, _parse_text(value))


def _whole(value: object, q: Fraction) -> int:
    if q < 0:
        raise QuantityError(f"{_show(value)} is negative")
    if q.denominator != 1:
        raise QuantityError(f"{_show(value)} is not a whole number (extended resources must be integers)")
    return int(q)
