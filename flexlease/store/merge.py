"""JSON merge patch (RFC 7386), as a pure function.

The ``patch`` verb of every store (and Kubernetes' ``application/merge-patch+json``) applies
a merge patch: ``null`` deletes a key, objects merge recursively, anything else (strings,
numbers, booleans, arrays) replaces the target's value. No I/O, no asyncio.
"""

from __future__ import annotations

from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply ``patch`` to ``target`` as RFC 7386 §2 ``MergePatch(Target, Patch)`` defines it.

    In: any JSON values (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``).
    Out: the patched value. Neither argument is modified; the result shares unchanged
    sub-values with ``target`` and ``patch``, so treat all three as read-only (copy
    before mutating). A non-object ``patch`` replaces ``target`` entirely; an object
    ``patch`` applied to a non-object ``target`` starts from ``{}``; members whose patch value
    is ``null`` are removed (a ``null`` inside an array is kept: arrays replace whole).
    """
    if not isinstance(patch, dict):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
