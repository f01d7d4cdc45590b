"""flexlease.store.watching.WatchRegistry: the live watches of a kind, weakly held."""

from __future__ import annotations

import gc

from flexlease.store.watching import WatchRegistry


class _Watch:
    pass


def test_registry_lists_live_watches_and_forgets_discarded_or_collected_ones() -> None:
    registry: WatchRegistry[_Watch] = WatchRegistry()
    a, b, c = _Watch(), _Watch(), _Watch()
    for w in (a, b, c):
        registry.add(w)
    assert list(registry) == [a, b, c] and len(registry) == 3
    registry.discard(b)
    registry.discard(b)  # twice is fine
    registry.discard(_Watch())  # never added
    assert list(registry) == [a, c]
    del c, w  # the loop variable held the last one too
    gc.collect()
    assert list(registry) == [a] and len(registry) == 1
    for w in registry:  # a watch may leave while the store iterates
        registry.discard(w)
    assert list(registry) == [] and len(registry) == 0
