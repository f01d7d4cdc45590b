"""HotRestartController's write discipline, with a MemoryStore whose patches can fail and the
in-memory FakeCri: nothing is touched before InProgress is recorded, and a final status whose
write failed is written again without redoing the restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexlease import errors
from flexlease.api import keys
from flexlease.store.base import Kind
from flexlease.store.informer import Backoff
from flexlease.store.memory import MemoryStore
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri import podspec
from nodeagent.cri.client import ContainerState
from nodeagent.cri.fake import FakeCri
from nodeagent.hotrestart.controller import HotRestartController, HotRestartMetrics, pending_request
from nodeagent.hotrestart.model import HotRestartStatus, Phase, RollbackStatus, Strategy, parse_status
from nodeagent.hotrestart.restarter import HotRestarter

V1, V2 = "reg/t:v1", "reg/t:v2"


class FlakyStore(MemoryStore):
    """A MemoryStore whose next ``failures`` pod patches containing ``needle`` fail."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.needle = ""

    async def patch(self, kind: Kind, name: str, patch: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if self.failures and self.needle in json.dumps(patch):
            self.failures -= 1
            raise errors.StoreError("etcdserver: request timed out", status=500)
        return await super().patch(kind, name, patch, **kw)


@pytest.fixture
async def store() -> AsyncIterator[FlakyStore]:
    s = FlakyStore()
    try:
        yield s
    finally:
        await s.close()


async def setup(store: FlakyStore) -> tuple[FakeCri, HotRestartController, CollectorRegistry]:
    pod = await store.create(
        Kind.POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "image": V1}]},
        },
    )
    cri = FakeCri(registry={V2: 10})
    cri.add_image(V1, 10)
    ref = podspec.PodRef("ns", "p", pod["metadata"]["uid"])
    sandbox_config = podspec.sandbox_config(ref, Path("/tmp/logs"))
    sid = await cri.run_pod_sandbox(sandbox_config)
    cid = await cri.create_container(
        sid, podspec.container_config(ref, podspec.ContainerSpec("trainer", V1)), sandbox_config
    )
    await cri.start_container(cid)
    registry = CollectorRegistry()
    restarter = HotRestarter(cri, ImagePuller(cri, ImageMetrics(registry)))
    controller = HotRestartController(
        store,
        cri,
        restarter,
        node="n1",
        default_strategy=Strategy.DIRECT,
        backoff=Backoff(initial=0.001, maximum=0.001),
        metrics=HotRestartMetrics(registry),
    )
    request = json.dumps({"id": "r1", "container": "trainer", "image": V2})
    await store.patch(
        Kind.POD, "p", {"metadata": {"annotations": {keys.ANN_HOT_RESTART: request}}}, namespace="ns"
    )
    return cri, controller, registry


async def status_of(store: MemoryStore) -> Any:
    pod = await store.get(Kind.POD, "p", namespace="ns")
    return parse_status(pod["metadata"]["annotations"].get(keys.ANN_HOT_RESTART_STATUS))


async def test_nothing_happens_until_in_progress_is_recorded(store: FlakyStore) -> None:
    cri, controller, _ = await setup(store)
    store.failures, store.needle = 3, "InProgress"
    with pytest.raises(errors.StoreError):
        await controller.reconcile("ns", "p")
    assert cri.pulls == [] and len(cri.containers) == 1
    assert await status_of(store) is None
    await controller.reconcile("ns", "p")
    assert (await status_of(store)).phase is Phase.SUCCEEDED


async def test_a_lost_final_write_is_written_again_without_redoing_the_work(store: FlakyStore) -> None:
    cri, controller, registry = await setup(store)
    store.failures, store.needle = 3, "Succeeded"
    with pytest.raises(errors.StoreError):
        await controller.reconcile("ns", "p")
    in_progress = await status_of(store)
    assert in_progress.phase is Phase.IN_PROGRESS and in_progress.previous_attempt == 0
    containers_after_restart = dict(cri.containers)
    await controller.reconcile("ns", "p")
    final = await status_of(store)
    assert final.phase is Phase.SUCCEEDED and final.pull_seconds is not None  # the original timings
    assert cri.containers == containers_after_restart  # nothing was restarted twice
    assert registry.get_sample_value("flexlease_hot_restarts_total", {"outcome": "succeeded"}) == 1
    assert registry.get_sample_value("flexlease_hot_restart_seconds_count", {"step": "total"}) == 1


async def test_after_an_agent_restart_the_running_replacement_is_adopted(store: FlakyStore) -> None:
    cri, controller, _ = await setup(store)
    store.failures, store.needle = 3, "Succeeded"
    with pytest.raises(errors.StoreError):
        await controller.reconcile("ns", "p")
    # A new agent process (no memory of the unwritten status) finds InProgress + the replacement.
    fresh = HotRestartController(
        store,
        cri,
        HotRestarter(cri, ImagePuller(cri, ImageMetrics(CollectorRegistry()))),
        node="n1",
        default_strategy=Strategy.DIRECT,
    )
    await fresh.reconcile("ns", "p")
    final = await status_of(store)
    assert final.phase is Phase.SUCCEEDED and final.message is not None and "already running" in final.message
    running = [c for c in cri.containers.values() if c.state is ContainerState.RUNNING]
    assert [(c.image, c.attempt, c.id) for c in running] == [(V2, 1, final.container_id)]


async def test_pods_of_other_nodes_and_pods_without_requests_are_ignored(store: FlakyStore) -> None:
    cri, controller, _ = await setup(store)
    await store.create(
        Kind.POD,
        {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"nodeName": "other", "containers": []}},
    )
    await controller.reconcile("ns", "q")
    await controller.reconcile("ns", "absent")
    assert cri.pulls == []
    pod = await store.get(Kind.POD, "p", namespace="ns")
    assert pending_request(pod)
    await controller.reconcile("ns", "p")
    assert not pending_request(await store.get(Kind.POD, "p", namespace="ns"))


async def test_the_status_names_every_container_that_runs(store: FlakyStore) -> None:
    """When something else starts a copy of the container during the restart (a kubelet that
    saw the old one die), the status fails and names both instead of naming one as success."""
    cri, controller, _ = await setup(store)
    [old_id] = list(cri.containers)
    sandbox_id = cri.containers[old_id].sandbox_id
    orphan_config = cri.container_configs[old_id]
    real_stop = cri.stop_container

    async def stop_then_someone_restarts(container_id: str, *, timeout_seconds: int) -> None:
        await real_stop(container_id, timeout_seconds=timeout_seconds)
        copy = type(orphan_config)()
        copy.CopyFrom(orphan_config)
        copy.metadata.attempt = 7
        other = await cri.create_container(sandbox_id, copy, await cri.pod_sandbox_config(sandbox_id))
        await cri.start_container(other)

    cri.stop_container = stop_then_someone_restarts  # type: ignore[method-assign]
    await controller.reconcile("ns", "p")
    final = await status_of(store)
    running = sorted(
        (c for c in cri.containers.values() if c.state is ContainerState.RUNNING), key=lambda c: c.attempt
    )
    assert len(running) == 2
    assert final.phase is Phase.FAILED
    assert final.message.startswith("2 containers named 'trainer' run in sandbox")
    assert all(c.id in final.message for c in running)
    assert final.container_id == running[-1].id


async def test_a_final_status_with_a_rollback_under_way_is_still_pending(store: FlakyStore) -> None:
    """The watch's pre-check enqueues a pod whose restart failed while its rollback has not
    ended (the agent stopped in between), and not once the rollback ended."""
    await setup(store)
    failed = HotRestartStatus(
        id="r1",
        phase=Phase.FAILED,
        strategy=Strategy.KUBELET,
        container="trainer",
        image=V2,
        rollback=RollbackStatus(phase=Phase.IN_PROGRESS, image=V1),
    )
    await store.patch(
        Kind.POD,
        "p",
        {"metadata": {"annotations": {keys.ANN_HOT_RESTART_STATUS: failed.render()}}},
        namespace="ns",
    )
    assert pending_request(await store.get(Kind.POD, "p", namespace="ns"))
    ended = failed.model_copy(update={"rollback": RollbackStatus(phase=Phase.SUCCEEDED, image=V1)})
    await store.patch(
        Kind.POD,
        "p",
        {"metadata": {"annotations": {keys.ANN_HOT_RESTART_STATUS: ended.render()}}},
        namespace="ns",
    )
    assert not pending_request(await store.get(Kind.POD, "p", namespace="ns"))
