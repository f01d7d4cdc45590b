"""Pure matching: which pod kubelet is admitting, from the device set it passes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.deviceplugin.matching import (
    PendingPod,
    PreferenceKind,
    allocated_pod,
    compare,
    exchange,
    merge_container_devices,
    prefer,
)

IDS = [f"GPU-{i}" for i in range(8)]


def pod(key: str, *indices: int, seq: int = 0, allocated: tuple[int, ...] = ()) -> PendingPod:
    return PendingPod(
        key=key,
        uid=key,
        uuids=tuple(IDS[i] for i in indices),
        allocated=frozenset(IDS[i] for i in allocated),
        seq=seq,
    )


def test_the_only_pod_of_the_requested_size_is_chosen() -> None:
    pods = [pod("a", 0, seq=1), pod("b", 5, 6, seq=2)]
    p = prefer(pods, IDS, [], 2)
    assert (p.devices, p.pod, p.kind) == ((IDS[5], IDS[6]), "b", PreferenceKind.UNIQUE)


def test_equal_fits_go_to_the_first_bound_and_are_marked_ambiguous() -> None:
    pods = [pod("late", 0, 1, seq=9), pod("early", 6, 7, seq=3)]
    p = prefer(pods, IDS, [], 2)
    assert (p.devices, p.pod, p.kind, p.others) == (
        (IDS[6], IDS[7]),
        "early",
        PreferenceKind.ORDERED,
        ("late",),
    )
    assert p.ambiguous


def test_allocated_pods_and_unavailable_devices_do_not_fit() -> None:
    pods = [pod("done", 0, 1, seq=1, allocated=(0, 1)), pod("blocked", 2, 3, seq=2), pod("next", 4, 5, seq=3)]
    available = [IDS[i] for i in (0, 1, 2, 4, 5)]  # GPU-3 still held by a terminating pod
    p = prefer(pods, available, [], 2)
    assert (p.pod, p.kind) == ("next", PreferenceKind.UNIQUE)


def test_must_include_pins_the_pod_holding_it() -> None:
    pods = [pod("a", 0, 1, seq=1), pod("b", 2, 3, 4, seq=2, allocated=(2,))]
    p = prefer(pods, IDS, [IDS[2]], 2)
    assert (p.pod, p.kind, p.devices) == ("b", PreferenceKind.PINNED, (IDS[2], IDS[3]))


def test_a_multi_container_pod_fits_partially_after_exact_fits() -> None:
    pods = [pod("multi", 0, 1, 2, seq=1), pod("exact", 5, seq=2)]
    assert prefer(pods, IDS, [], 1).pod == "exact"
    assert prefer([pods[0]], IDS, [], 1).devices == (IDS[0],)


def test_no_fit_falls_back_to_kubelets_order() -> None:
    p = prefer([pod("a", 0, 1)], IDS[2:], [IDS[3]], 2)
    assert (p.devices, p.pod, p.kind) == ((IDS[3], IDS[2]), None, PreferenceKind.NONE)


def test_allocate_maps_a_device_set_back_to_exactly_one_pod() -> None:
    pods = [pod("a", 0, 1), pod("b", 2, 3)]
    assert allocated_pod(pods, [IDS[3], IDS[2]]) == pods[1]
    assert allocated_pod(pods, [IDS[1]]) == pods[0]
    assert allocated_pod(pods, [IDS[1], IDS[2]]) is None  # spans two assignments
    assert allocated_pod(pods, []) is None
    assert allocated_pod(pods, [IDS[7]]) is None


def test_pod_resources_entries_are_merged_per_resource() -> None:
    entries = [("nvidia.com/gpu", ["id-2"]), ("other/x", ["x"]), ("nvidia.com/gpu", ["id-3", "id-2"])]
    assert merge_container_devices(entries, "nvidia.com/gpu") == ("id-2", "id-3")


def test_compare_ignores_order() -> None:
    assert compare("p", ["a", "b"], ["b", "a"]) is None
    mismatch = compare("p", ["a", "b"], ["c", "b"])
    assert mismatch is not None and mismatch.actual == {"b", "c"}


@st.composite
def node_state(draw: st.DrawFn) -> tuple[list[PendingPod], list[str], int]:
    """Disjoint assignments over 8 GPUs, some allocated, a random available set and size."""
    order = draw(st.permutations(range(8)))
    cuts = sorted(draw(st.lists(st.integers(0, 8), max_size=4)))
    pods = []
    start = 0
    for n, end in enumerate([*cuts, 8]):
        chunk = order[start:end]
        start = end
        if chunk:
            done = draw(st.booleans())
            pods.append(
                pod(f"p{n}", *chunk, seq=draw(st.integers(0, 5)), allocated=tuple(chunk) if done else ())
            )
    available = sorted(draw(st.sets(st.sampled_from(IDS))))
    size = draw(st.integers(0, len(available)))
    return pods, available, size


@given(node_state())
def test_a_preference_is_always_valid_for_kubelet(state: tuple[list[PendingPod], list[str], int]) -> None:
    pods, available, size = state
    p = prefer(pods, available, [], size)
    assert len(p.devices) == size and len(set(p.devices)) == size
    assert set(p.devices) <= set(available)
    if p.pod is not None:
        chosen = next(x for x in pods if x.key == p.pod)
        assert set(p.devices) <= set(chosen.remaining)
        # and Allocate of those devices maps back to that same pod
        assert size == 0 or allocated_pod(pods, p.devices) == chosen


def test_kubelets_list_singles_out_the_pod_being_admitted() -> None:
    pods = [pod("first", 0, 1, seq=1), pod("second", 2, 3, seq=2), pod("third", 4, 5, seq=3)]
    # kubelet admits "third" first: it lists it (without devices), not the other two yet
    listed = {"third": frozenset(), "other/no-gpu": frozenset(), "old": frozenset({IDS[7]})}
    p = prefer(pods, IDS, [], 2, listed=listed)
    assert (p.pod, p.kind, p.devices) == ("third", PreferenceKind.ADMITTING, (IDS[4], IDS[5]))
    # several listed without devices (a batch): the bind order among them, marked ambiguous;
    # "first", bound earlier, is not in kubelet's pod manager, so it is not being admitted
    p = prefer(pods, IDS, [], 2, listed={"second": frozenset(), "third": frozenset()})
    assert (p.pod, p.kind, p.others) == ("second", PreferenceKind.ORDERED, ("third",))
    # kubelet lists none of the fitting pods (a List that does not show admissions): the bind order
    p = prefer(pods, IDS, [], 2, listed={"other/no-gpu": frozenset()})
    assert (p.pod, p.kind) == ("first", PreferenceKind.ORDERED)
    # the only fitting pod kubelet lists, even if it has no rival in the book
    p = prefer([pod("only", 0, 1, seq=1)], IDS, [], 2, listed={"only": frozenset()})
    assert (p.pod, p.kind) == ("only", PreferenceKind.ADMITTING)


def test_a_listed_pod_of_the_book_that_does_not_fit_gets_devices_no_pending_pod_holds() -> None:
    """kubelet admits "held" (its GPUs 0, 1 not available yet: a terminating pod holds them);
    "waiting", not listed, fits the request but is not being admitted: its GPUs stay its own."""
    pods = [pod("held", 0, 1, seq=1), pod("waiting", 2, 3, seq=2)]
    available = IDS[2:]
    p = prefer(pods, available, [], 2, listed={"held": frozenset()})
    assert (p.pod, p.kind, p.devices) == ("held", PreferenceKind.UNFIT, (IDS[4], IDS[5]))
    # no spare devices: the claimed ones, still a valid answer for kubelet
    p = prefer(pods, IDS[2:4], [], 2, listed={"held": frozenset()})
    assert (p.kind, set(p.devices)) == (PreferenceKind.UNFIT, {IDS[2], IDS[3]})
    # an unknown pod being admitted (the watch trails): the book's fit, for the server to wait on
    p = prefer(pods, available, [], 2, listed={"unknown": frozenset()})
    assert (p.pod, p.kind) == ("waiting", PreferenceKind.UNIQUE)


def test_exchange_gives_the_pending_pod_the_devices_the_admitted_one_left() -> None:
    pods = [pod("x", 0, 1, seq=1), pod("y", 2, 3, seq=2), pod("z", 4, seq=3, allocated=(4,))]
    writes = exchange("x", [IDS[2], IDS[3]], pods, allocated={"x": frozenset({IDS[2], IDS[3]})})
    assert writes == {"x": (IDS[2], IDS[3]), "y": (IDS[0], IDS[1])}
    # partly overlapping: only the taken device is replaced
    writes = exchange("x", [IDS[1], IDS[2]], pods, allocated={})
    assert writes == {"x": (IDS[1], IDS[2]), "y": (IDS[0], IDS[3])}
    # an allocated pod is never rewritten here (its own read-back entry corrects it)
    writes = exchange("x", [IDS[4], IDS[5]], pods, allocated={"z": frozenset({IDS[6]})})
    assert writes == {"x": (IDS[4], IDS[5])}


@given(node_state(), st.data())
def test_exchanged_assignments_stay_disjoint(
    state: tuple[list[PendingPod], list[str], int], data: st.DataObject
) -> None:
    pods, _, _ = state
    if not pods:
        return
    victim = data.draw(st.sampled_from(pods))
    held = {u for p in pods if p.allocated for u in p.uuids}
    free = [u for u in IDS if u not in held or u in victim.uuids]
    actual = data.draw(st.permutations(free)).__getitem__(slice(0, len(victim.uuids)))
    allocated = {p.key: frozenset(p.uuids) for p in pods if p.allocated and p.key != victim.key}
    writes = exchange(victim.key, actual, pods, allocated=allocated)
    final = {p.key: set(writes.get(p.key, p.uuids)) for p in pods}
    # the admitted pod and every pod still pending end up on disjoint devices
    group = [k for k in final if k not in allocated]
    assert sum(len(final[k]) for k in group) == len(set().union(*(final[k] for k in group))), final
    assert all(
        len(writes[k]) == len(next(p for p in pods if p.key == k).uuids) for k in writes if k != victim.key
    )
