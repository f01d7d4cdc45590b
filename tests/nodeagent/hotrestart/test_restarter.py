"""HotRestarter's failure handling, against the in-memory FakeCri (the happy paths and the
containerd restart run on real containerd in test_controller.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexlease import errors
from nodeagent.cache.images import ImageMetrics, ImagePuller
from nodeagent.cri import podspec
from nodeagent.cri.client import ContainerState
from nodeagent.cri.fake import FakeCri
from nodeagent.hotrestart.decide import PodFacts, Restart, RuntimeView, decide
from nodeagent.hotrestart.model import CheckpointRef, HotRestartRequest, Strategy
from nodeagent.hotrestart.restarter import HotRestarter

V1, V2 = "reg/t:v1", "reg/t:v2"


async def setup(strategy: Strategy = Strategy.DIRECT) -> tuple[FakeCri, HotRestarter, Restart]:
    cri = FakeCri(registry={V2: 100})
    cri.add_image(V1, 100)
    ref = podspec.PodRef("ns", "p", "uid-1")
    sandbox_config = podspec.sandbox_config(ref, Path("/tmp/logs"), no_kubelet=strategy is Strategy.DIRECT)
    sid = await cri.run_pod_sandbox(sandbox_config)
    config = podspec.container_config(ref, podspec.ContainerSpec("trainer", V1))
    cid = await cri.create_container(sid, config, sandbox_config)
    await cri.start_container(cid)
    restarter = HotRestarter(
        cri, ImagePuller(cri, ImageMetrics(CollectorRegistry())), kubelet_wait_seconds=0.05, poll_seconds=0.01
    )
    view = RuntimeView(await cri.pod_sandbox_status(sid), tuple(await cri.list_containers(sandbox_id=sid)))
    plan = decide(
        HotRestartRequest(id="r", container="trainer", image=V2),
        None,
        view,
        default_strategy=strategy,
        pod=PodFacts(spec_image=V1),
    )
    assert isinstance(plan, Restart)
    return cri, restarter, plan


def running(cri: FakeCri) -> list[tuple[str, int]]:
    return sorted((c.image, c.attempt) for c in cri.containers.values() if c.state is ContainerState.RUNNING)


async def test_direct_success_pulls_replaces_and_removes_the_old_container() -> None:
    cri, restarter, plan = await setup()
    outcome = await restarter.execute(plan, pod="ns/p")
    assert outcome.succeeded and outcome.attempt == 1 and outcome.image_cached is False
    assert cri.pulls == [V2]
    assert running(cri) == [(V2, 1)]
    assert plan.old.id not in cri.containers
    new_config = cri.container_configs[outcome.container_id or ""]
    assert new_config.log_path == "trainer/1.log" and new_config.metadata.attempt == 1


async def test_failed_create_leaves_the_old_container_running() -> None:
    cri, restarter, plan = await setup()
    cri.fail["create_container"] = errors.CriError("no space left on device")
    outcome = await restarter.execute(plan, pod="ns/p")
    assert not outcome.succeeded
    assert "old container left running" in outcome.message and "no space" in outcome.message
    assert running(cri) == [(V1, 0)]


async def test_failed_stop_removes_the_replacement() -> None:
    cri, restarter, plan = await setup()
    cri.fail["stop_container"] = errors.CriError("cannot kill")
    outcome = await restarter.execute(plan, pod="ns/p")
    assert not outcome.succeeded and "cannot stop the old container" in outcome.message
    assert running(cri) == [(V1, 0)]
    assert [c.attempt for c in cri.containers.values()] == [0]


async def test_failed_start_rolls_back_to_the_old_config() -> None:
    cri, restarter, plan = await setup()
    cri.unstartable.add(V2)  # containerd: StartError, exit code 128
    outcome = await restarter.execute(plan, pod="ns/p")
    assert not outcome.succeeded
    assert "did not start" in outcome.message and "rolled back to reg/t:v1" in outcome.message
    assert "no-such-entrypoint" in outcome.message
    assert running(cri) == [(V1, 2)]
    assert outcome.rollback is not None and outcome.rollback.succeeded
    assert outcome.rollback.container is not None and outcome.container_id == outcome.rollback.container.id
    assert outcome.attempt == 2 and outcome.pause_seconds is not None and outcome.pause_seconds >= 0


async def test_failed_start_with_rollback_off_is_only_reported() -> None:
    cri, _, plan = await setup()
    restarter = HotRestarter(cri, ImagePuller(cri, ImageMetrics(CollectorRegistry())), rollback=False)
    cri.unstartable.add(V2)
    outcome = await restarter.execute(plan, pod="ns/p")
    assert not outcome.succeeded and outcome.message.endswith("not rolled back (rollback is off)")
    assert running(cri) == [] and outcome.rollback is None
    [failed] = [c for c in cri.containers.values() if c.attempt == 1]
    assert (failed.state, failed.exit_code, failed.reason) == (ContainerState.EXITED, 128, "StartError")


async def test_unavailable_runtime_propagates_for_a_retry() -> None:
    cri, restarter, plan = await setup()
    cri.fail["start_container"] = errors.CriUnavailable("containerd restarting")
    with pytest.raises(errors.CriUnavailable):
        await restarter.execute(plan, pod="ns/p")
    cri2, restarter2, plan2 = await setup()
    cri2.fail["image_status"] = errors.CriUnavailable("containerd restarting")
    with pytest.raises(errors.CriUnavailable):
        await restarter2.execute(plan2, pod="ns/p")
    assert running(cri2) == [(V1, 0)]


async def test_missing_image_fails_before_touching_anything() -> None:
    cri, restarter, plan = await setup()
    cri.registry.clear()
    outcome = await restarter.execute(plan, pod="ns/p")
    assert not outcome.succeeded and outcome.message.startswith(
        "image pull failed (old container left running)"
    )
    assert running(cri) == [(V1, 0)]


async def test_kubelet_strategy_patches_the_spec_and_stops_nothing() -> None:
    cri, restarter, plan = await setup(Strategy.KUBELET)
    assert plan.spec_image == V2
    patched: list[str] = []

    async def patch_spec(image: str) -> None:
        patched.append(image)

    outcome = await restarter.execute(plan, pod="ns/p", patch_spec=patch_spec)
    assert patched == [V2]
    assert not outcome.succeeded and "kubelet did not restart 'trainer'" in outcome.message
    assert outcome.image_id is not None and outcome.image_id.startswith("sha256:")
    assert running(cri) == [(V1, 0)]  # the agent never stops a kubelet's container

    no_patch = await restarter.execute(plan, pod="ns/p")
    assert not no_patch.succeeded and "pod spec" in no_patch.message
    assert running(cri) == [(V1, 0)]


async def test_a_checkpoint_without_a_cache_fails_before_touching_anything() -> None:
    cri, restarter, plan = await setup()
    ckpt = CheckpointRef(id="j/1", url="file:///nowhere", sha256="0" * 64)
    outcome = await restarter.execute(plan, pod="ns/p", checkpoint=ckpt)
    assert not outcome.succeeded and "no checkpoint cache" in outcome.message
    assert outcome.prelaunch is not None and not outcome.prelaunch.ready
    assert running(cri) == [(V1, 0)] and cri.pulls == []


def _kubelet_restarter(cri: FakeCri, wait: float = 60.0) -> HotRestarter:
    return HotRestarter(
        cri, ImagePuller(cri, ImageMetrics(CollectorRegistry())), kubelet_wait_seconds=wait, poll_seconds=0.01
    )


async def test_kubelet_strategy_reports_a_crash_looping_replacement_with_its_newest_attempt() -> None:
    """kubelet restarted the new image five times (StartError, exit code 128) before the agent
    looked: Failed at once, long before the 60 s wait, naming the newest attempt."""
    cri, _, plan = await setup(Strategy.KUBELET)
    restarter = _kubelet_restarter(cri)
    ref = podspec.PodRef("ns", "p", "uid-1")
    cri.unstartable.add(V2)

    async def kubelet_acts(image: str) -> None:  # the spec patch, and kubelet's work on it
        await cri.stop_container(plan.old.id, timeout_seconds=1)
        sandbox_config = await cri.pod_sandbox_config(plan.sandbox_id)
        for attempt in range(1, 6):
            config = podspec.container_config(ref, podspec.ContainerSpec("trainer", image), attempt=attempt)
            cid = await cri.create_container(plan.sandbox_id, config, sandbox_config)
            with pytest.raises(errors.CriError):
                await cri.start_container(cid)

    outcome = await asyncio.wait_for(restarter.execute(plan, pod="ns/p", patch_spec=kubelet_acts), 10)
    assert not outcome.succeeded and outcome.spec_patched
    assert outcome.attempt == 5
    assert "(attempt 5) failed: StartError (exit code 128)" in outcome.message
    assert outcome.old_exit_ns > 0 and outcome.image_id is not None


async def test_kubelet_strategy_reports_kubelets_waiting_reason_once_the_old_container_stopped() -> None:
    cri, _, plan = await setup(Strategy.KUBELET)
    restarter = _kubelet_restarter(cri)
    shown: dict[str, Any] = {"name": "trainer", "state": {"running": {}}}
    stopped = asyncio.Event()

    async def stop_later() -> None:  # kubelet kills the old container a moment later
        await asyncio.sleep(0.2)
        await cri.stop_container(plan.old.id, timeout_seconds=1)
        stopped.set()

    async def kubelet_acts(image: str) -> None:
        # A failure reason already shown while the old container still runs: not trusted yet.
        shown["state"] = {"waiting": {"reason": "CreateContainerError", "message": "no command specified"}}
        tasks.append(asyncio.create_task(stop_later()))

    tasks: list[asyncio.Task[None]] = []
    outcome = await asyncio.wait_for(
        restarter.execute(plan, pod="ns/p", patch_spec=kubelet_acts, container_status=lambda: dict(shown)), 10
    )
    assert stopped.is_set()
    await asyncio.gather(*tasks)
    assert not outcome.succeeded and outcome.spec_patched
    assert outcome.message == (
        "kubelet cannot run the replacement of 'trainer': CreateContainerError: no command specified"
    )


async def test_kubelet_rollback_waits_for_the_previous_image_to_run() -> None:
    cri, _, plan = await setup(Strategy.KUBELET)
    restarter = _kubelet_restarter(cri, wait=0.3)
    ref = podspec.PodRef("ns", "p", "uid-1")
    await cri.stop_container(plan.old.id, timeout_seconds=1)
    patched: list[str] = []

    async def kubelet_runs(image: str) -> None:
        patched.append(image)
        sandbox_config = await cri.pod_sandbox_config(plan.sandbox_id)
        config = podspec.container_config(ref, podspec.ContainerSpec("trainer", image), attempt=2)
        await cri.start_container(await cri.create_container(plan.sandbox_id, config, sandbox_config))

    back = await restarter.roll_back_kubelet(
        plan.sandbox_id, "trainer", image=V1, previous_attempt=0, patch_spec=kubelet_runs, pod="ns/p"
    )
    assert patched == [V1] and back.succeeded and back.container is not None
    assert (back.container.attempt, back.container.state) == (2, ContainerState.RUNNING)

    async def kubelet_away(image: str) -> None:
        return None

    await cri.stop_container(back.container.id, timeout_seconds=1)
    gone = await restarter.roll_back_kubelet(
        plan.sandbox_id, "trainer", image=V1, previous_attempt=0, patch_spec=kubelet_away, pod="ns/p"
    )
    assert not gone.succeeded and gone.message == f"kubelet did not run 'trainer' with {V1} within 0.3 s"
