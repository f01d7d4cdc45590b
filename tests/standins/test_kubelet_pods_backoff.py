"""The stand-in kubelet's crash-loop back-off and spec hash, pure (no runtime)."""

from __future__ import annotations

from standins.kubelet_pods import BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS, Backoff, hash_container


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_from_10s_to_5min_and_resets_after_10min() -> None:
    assert (BACKOFF_INITIAL_SECONDS, BACKOFF_MAX_SECONDS) == (10.0, 300.0)
    clock = Clock()
    b = Backoff(clock=clock)
    assert not b.is_in_backoff_since("k", clock.now)  # first restart: at once
    b.next("k", clock.now)
    seen = []
    for _ in range(7):
        exited = clock.now
        assert b.is_in_backoff_since("k", exited)
        clock.now += b.get("k") - 0.001
        assert b.is_in_backoff_since("k", exited)
        clock.now += 0.001
        assert not b.is_in_backoff_since("k", exited)
        b.next("k", exited)
        seen.append(b.get("k"))
    assert seen == [20, 40, 80, 160, 300, 300, 300]
    # Running for more than 2 x 5 min: the next exit starts from 10 s again.
    clock.now += 600.5
    assert not b.is_in_backoff_since("k", clock.now)
    b.next("k", clock.now)
    assert b.get("k") == 10
    # Keys are independent (kubelet's key includes the spec hash).
    assert not b.is_in_backoff_since("other", clock.now)


def test_hash_changes_with_any_spec_change() -> None:
    c = {"name": "trainer", "image": "r/t:v1", "env": [{"name": "A", "value": "1"}]}
    assert hash_container(c) == hash_container(dict(reversed(list(c.items()))))
    assert hash_container(c) != hash_container({**c, "image": "r/t@sha256:" + "a" * 64})
    assert hash_container(c) != hash_container({**c, "env": []})
    assert int(hash_container(c), 16) < 2**32


def test_image_backoff_counts_from_the_last_failed_pull() -> None:
    clock = Clock()
    b = Backoff(clock=clock)
    assert not b.is_in_backoff_since_update("img", clock.now)  # no failure yet: pull
    b.next("img", clock.now)  # a pull failed at t: 10 s
    assert b.is_in_backoff_since_update("img", clock.now + 9.9)
    assert not b.is_in_backoff_since_update("img", clock.now + 10)
    clock.now += 10
    b.next("img", clock.now)  # failed again: 20 s from now
    assert b.is_in_backoff_since_update("img", clock.now + 19.9)
    assert not b.is_in_backoff_since_update("img", clock.now + 20)
    assert not b.is_in_backoff_since_update("img", clock.now + 601)  # expired: starts over
