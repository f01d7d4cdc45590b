"""The store seam (see :mod:`flexlease.store.base`)."""

from flexlease.store.base import (
    EVERYTHING,
    EventType,
    JsonObj,
    Kind,
    ObjectList,
    Selector,
    Store,
    WatchEvent,
)

__all__ = [
    "EVERYTHING",
    "EventType",
    "JsonObj",
    "Kind",
    "ObjectList",
    "Selector",
    "Store",
    "WatchEvent",
]
