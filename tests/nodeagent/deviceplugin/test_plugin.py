"""The device plugin against the test kubelet over real gRPC on unix sockets: registration,
kubelet restarts, ListAndWatch health, allocation of pods bound in quick succession, and the
PodResources read-back that writes a forced mismatch back to the pod."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest
from prometheus_client import CollectorRegistry

from flexlease.api import keys
from flexlease.store.base import Kind
from nodeagent import agent
from nodeagent.cri.client import ContainerState, GrpcCri
from nodeagent.deviceplugin import deviceplugin_pb2 as pb
from nodeagent.deviceplugin import podresources_pb2 as prpb
from nodeagent.deviceplugin import rpc
from nodeagent.deviceplugin.component import DevicePluginComponent
from nodeagent.deviceplugin.response import ENV_VISIBLE_DEVICES
from nodeagent.health.watch import HealthWatch
from standins.kubelet_devices import AdmissionError, Call
from tests.nodeagent.conftest import ContainerdTestbed, KubeletFactory
from tests.nodeagent.deviceplugin.kit import RESOURCE, Node, running_node
from tests.nodeagent.health.kit import NODE, make_context, node_config


def sample(node: Node, name: str, **labels: str) -> float | None:
    return node.ctx.registry.get_sample_value(name, {"node": NODE, **labels})


async def test_registers_and_advertises_every_gpu_by_uuid() -> None:
    async with running_node(gpus=4) as node:
        (request,) = node.kubelet.registrations
        assert request.version == "v1beta1"
        assert request.endpoint == "flexlease-gpu.sock"
        assert request.resource_name == RESOURCE
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required  # kubelet starts GPU containers without the agent
        assert node.kubelet.plugins[RESOURCE].devices == {u: "Healthy" for u in node.uuids}
        assert all(u.startswith("GPU-") for u in node.uuids)
        # Node capacity shows the count only at kubelet's next node status update
        assert node.kubelet.node_status()["capacity"] == {}
        assert node.kubelet.update_node_status() == {
            "capacity": {RESOURCE: 4},
            "allocatable": {RESOURCE: 4},
        }
        assert node.plugin.ready()
        assert sample(node, "flexlease_deviceplugin_registered") == 1.0
        assert sample(node, "flexlease_deviceplugin_registrations_total", result="ok") == 1.0
        assert sample(node, "flexlease_deviceplugin_devices", health="Healthy") == 4.0


async def test_kubelet_restart_is_followed_by_a_new_registration_and_pods_keep_their_devices() -> None:
    async with running_node(gpus=4) as node:
        await node.bind("before", [2, 3])
        assert await node.admit("before", 2) == node.ids(2, 3)
        socket = node.ctx.settings.agent.device_plugin_dir / "flexlease-gpu.sock"

        calls_before = len(node.kubelet.calls)
        await node.kubelet.restart()
        assert not socket.exists()  # kubelet deleted the plugin's socket
        await node.kubelet.wait_registered(RESOURCE, registrations=2)
        await node.kubelet.wait_devices(RESOURCE, lambda d: len(d) == 4)
        assert socket.exists()  # served again, and kubelet follows the new ListAndWatch
        assert node.plugin.endpoint is not None and node.plugin.endpoint.registrations == 2
        assert set(node.kubelet.allocated("default", "before")["main"]) == node.ids(2, 3)
        assert not [c for c in node.kubelet.calls[calls_before:] if c.method == "Allocate"]
        assert sample(node, "flexlease_deviceplugin_registrations_total", result="ok") == 2.0

        # the re-registered plugin still allocates by assignment
        await node.bind("after", [0, 1])
        assert await node.admit("after", 2) == node.ids(0, 1)


async def test_a_wait_for_devices_follows_the_plugin_across_a_re_registration() -> None:
    """A waiter blocked on the plugin that a kubelet restart replaced wakes and reads the new
    registration's list (before, it waited on the old plugin's event until its time ran out:
    the demo's flaky "did not register 8 healthy GPUs")."""
    async with running_node(gpus=4) as node:
        first = node.kubelet.plugins[RESOURCE]
        waiting = asyncio.create_task(
            node.kubelet.wait_devices(
                RESOURCE, lambda d: node.kubelet.plugins[RESOURCE] is not first and len(d) == 4, limit_s=10
            )
        )
        await asyncio.sleep(0.05)  # blocked on the first plugin's event
        await node.kubelet.restart()
        await node.kubelet.wait_registered(RESOURCE, registrations=2)
        assert len(await asyncio.wait_for(waiting, 10)) == 4


async def test_list_and_watch_reports_a_failed_gpu_unhealthy_until_it_recovers() -> None:
    events = [{"at": 100, "gpu": 1, "event": "xid", "xid": 79}]
    async with running_node(gpus=4, events=events) as node:
        bad = node.uuids[1]
        await node.advance(100)
        devices = await node.kubelet.wait_devices(RESOURCE, lambda d: d[bad] == "Unhealthy")
        assert sorted(u for u, h in devices.items() if h == "Healthy") == sorted(set(node.uuids) - {bad})
        assert node.kubelet.update_node_status() == {"capacity": {RESOURCE: 4}, "allocatable": {RESOURCE: 3}}
        # an unhealthy GPU is never offered: a 4-GPU pod cannot be admitted now
        await node.bind("wide", [0, 1, 2, 3])
        with pytest.raises(AdmissionError, match="requested 4"):
            await node.admit("wide", 4)

        await node.advance(70)  # past the 60 s recovery hold-down: healthy again, no restart
        await node.kubelet.wait_devices(RESOURCE, lambda d: d[bad] == "Healthy")
        assert len(node.kubelet.registrations) == 1
        assert await node.admit("wide", 4) == frozenset(node.uuids)


async def test_pods_bound_in_quick_succession_each_get_exactly_their_assigned_gpus() -> None:
    async with running_node(gpus=8) as node:
        # equal counts, assignments in an order kubelet would never pick by itself
        plan = {"p0": [6, 7], "p1": [2, 5], "p2": [0, 3], "p3": [1, 4]}
        for name, indices in plan.items():
            await node.bind(name, indices)
        got = {}
        for name in plan:  # kubelet admits in the order the pods arrive
            got[name] = await node.admit(name, 2)
        for name, indices in plan.items():
            want = node.ids(*indices)
            assert got[name] == want, name
            assert set(node.kubelet.allocated("default", name)["main"]) == want

        # the observed call sequence: GPA(all available, no must-include, size 2) → Allocate
        first = node.kubelet.calls[:3]
        assert first[0] == Call("GetPreferredAllocation", available=tuple(sorted(node.uuids)), size=2)
        assert first[1].method == "Allocate" and set(first[1].devices) == got["p0"]
        assert first[2].method == "GetPreferredAllocation"  # the next pod's: no PreStartContainer
        assert sample(node, "flexlease_deviceplugin_allocations_total", result="matched") == 4.0
        assert sample(node, "flexlease_deviceplugin_allocations_total", result="unmatched") == 0.0

        # PodResources: one ContainerDevices entry per device, GetAllocatableResources every healthy one
        async with grpc.aio.insecure_channel(f"unix:{node.kubelet.pod_resources_socket}") as channel:
            listed = await rpc.unary_call(channel, rpc.POD_RESOURCES, "List", prpb.ListPodResourcesResponse)(
                prpb.ListPodResourcesRequest(), timeout=5
            )
            allocatable = await rpc.unary_call(
                channel, rpc.POD_RESOURCES, "GetAllocatableResources", prpb.AllocatableResourcesResponse
            )(prpb.AllocatableResourcesRequest(), timeout=5)
        p0 = next(p for p in listed.pod_resources if p.name == "p0")
        entries = [(d.resource_name, list(d.device_ids)) for d in p0.containers[0].devices]
        assert sorted(entries) == sorted((RESOURCE, [u]) for u in got["p0"])
        assert sorted(i for d in allocatable.devices for i in d.device_ids) == sorted(node.uuids)

        # nothing was mismatched: the read-back agrees
        assert node.plugin.reconciler is not None
        assert await node.plugin.reconciler.reconcile() == []


async def test_one_gpu_pods_bound_back_to_back_and_admitted_at_once() -> None:
    async with running_node(gpus=4) as node:
        order = [3, 1, 0, 2]
        # bind and admit without waiting for the agent's watch: Allocate waits for it
        names = [f"one-{i}" for i in range(4)]
        for name, index in zip(names, order, strict=True):
            await node.bind(name, [index])
        results = [await node.admit(name, 1) for name in names]
        assert results == [node.ids(i) for i in order]


async def test_allocate_answers_with_the_assigned_uuids_in_assignment_order() -> None:
    async with running_node(gpus=4, device_plugin_device_specs=True, cdi_prefix="nvidia.com/gpu") as node:
        await node.bind("ordered", [3, 0])
        got = await node.kubelet.admit("default", "ordered", [("main", 2)], resource=RESOURCE)
        response = got["main"].response
        assert response.envs[ENV_VISIBLE_DEVICES] == f"{node.uuids[3]},{node.uuids[0]}"
        minors = [node.ctx.board.devices[i].minor_number for i in (3, 0)]
        paths = [d.host_path for d in response.devices]
        assert paths[:2] == [f"/dev/nvidia{m}" for m in minors]
        assert set(paths[2:]) == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        assert [c.name for c in response.cdi_devices] == [f"nvidia.com/gpu={node.uuids[i]}" for i in (3, 0)]


async def test_a_forced_mismatch_is_detected_counted_and_written_back() -> None:
    async with running_node(gpus=4, device_plugin_match_wait_seconds=0.05) as node:
        await node.bind("victim", [0, 1])
        # kubelet ignores the preference (e.g. an older kubelet): it takes GPUs 2 and 3
        got = await node.admit("victim", 2, choose=lambda available, n: [node.uuids[2], node.uuids[3]])
        assert got == node.ids(2, 3)
        assert sample(node, "flexlease_deviceplugin_allocations_total", result="unmatched") == 1.0

        reconciler = node.plugin.reconciler
        assert reconciler is not None
        (suspect,) = await reconciler.reconcile()  # seen once: checked again next round
        assert sample(node, "flexlease_deviceplugin_mismatches_total") == 0.0
        (mismatch,) = await reconciler.reconcile()
        assert mismatch == suspect
        assert mismatch.key == "default/victim"
        assert mismatch.assigned == {node.uuids[0], node.uuids[1]}
        assert mismatch.actual == {node.uuids[2], node.uuids[3]}
        pod = await node.store.get(Kind.POD, "victim", namespace="default")
        ann = pod["metadata"]["annotations"]
        assert ann[keys.ANN_ASSIGNED_GPUS] == f"{NODE}:2,3"
        assert ann[keys.ANN_ASSIGNED_UUIDS] == f"{node.uuids[2]},{node.uuids[3]}"
        assert json.loads(ann[keys.ANN_ASSIGNMENT_CORRECTED])["was"] == f"{NODE}:0,1"
        assert sample(node, "flexlease_deviceplugin_mismatches_total") == 1.0
        assert sample(node, "flexlease_deviceplugin_writebacks_total", result="ok") == 1.0

        # once the watch shows the corrected assignment, the next rounds agree and count nothing
        for _ in range(200):
            if node.plugin.book is not None and set(node.plugin.book.uuids("default/victim") or ()) == got:
                break
            await asyncio.sleep(0.005)
        assert await reconciler.reconcile() == []
        assert sample(node, "flexlease_deviceplugin_mismatches_total") == 1.0
        assert sample(node, "flexlease_deviceplugin_kubelet_allocatable") == 4.0


async def test_a_pod_holding_gpus_without_an_assignment_gets_one_written() -> None:
    async with running_node(gpus=2, device_plugin_match_wait_seconds=0.05) as node:
        pod = await node.bind("stray", [0])
        # an operator's pod placed without the extender: no assignment annotations
        del pod["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS]
        await node.store.patch(
            Kind.POD,
            "stray",
            {"metadata": {"annotations": {keys.ANN_ASSIGNED_GPUS: None, keys.ANN_ASSIGNED_UUIDS: None}}},
            namespace="default",
        )
        got = await node.admit("stray", 1)
        assert node.plugin.reconciler is not None
        await node.plugin.reconciler.reconcile()
        (mismatch,) = await node.plugin.reconciler.reconcile()
        assert mismatch.assigned == frozenset()
        pod = await node.store.get(Kind.POD, "stray", namespace="default")
        index = node.uuids.index(next(iter(got)))
        assert pod["metadata"]["annotations"][keys.ANN_ASSIGNED_GPUS] == f"{NODE}:{index}"


async def test_after_an_agent_restart_allocated_pods_are_not_pending() -> None:
    async with running_node(gpus=4, device_plugin_match_wait_seconds=0.0) as node:
        await node.bind("old", [0, 1])
        assert await node.admit("old", 2) == node.ids(0, 1)
        # the agent restarts: a fresh component reads PodResources before registering
        node.stop.set()
        await asyncio.wait_for(node.task, 10)
        ctx, _ = await make_context(
            node.ctx.settings, node.store, node.clock, node_config(4), registry=CollectorRegistry()
        )
        plugin = DevicePluginComponent()
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(ctx, [HealthWatch(), plugin], stop=stop), name="test:agent2")
        try:
            await node.kubelet.wait_registered(RESOURCE, registrations=2)
            assert plugin.book is not None
            assert plugin.book.pending()[0].allocated == {node.uuids[0], node.uuids[1]}
            await node.bind("new", [3])
            assert await node.admit("new", 1) == node.ids(3)
            assert (
                ctx.registry.get_sample_value(
                    "flexlease_deviceplugin_preferred_total", {"node": NODE, "match": "admitting"}
                )
                == 1.0
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def test_prestart_is_not_required_but_still_answers_shuffled_ids() -> None:
    """kubelet never calls PreStartContainer (the option is off); a caller that does anyway,
    with the IDs in another order, gets an answer."""
    async with running_node(gpus=4) as node:
        await node.bind("p", [1, 2])
        assert await node.admit("p", 2) == node.ids(1, 2)
        await node.kubelet.pre_start_container("default", "p", "main")  # each container start
        assert not [c for c in node.kubelet.calls if c.method == "PreStartContainer"]
        allocate = next(c for c in node.kubelet.calls if c.method == "Allocate")
        socket = node.ctx.settings.agent.device_plugin_dir / node.ctx.settings.agent.device_plugin_socket
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            options = await rpc.unary_call(
                channel, rpc.DEVICE_PLUGIN, "GetDevicePluginOptions", pb.DevicePluginOptions
            )(pb.Empty(), timeout=5)
            assert not options.pre_start_required and options.get_preferred_allocation_available
            await rpc.unary_call(
                channel, rpc.DEVICE_PLUGIN, "PreStartContainer", pb.PreStartContainerResponse
            )(pb.PreStartContainerRequest(devices_ids=list(reversed(allocate.devices))), timeout=5)


async def test_pods_admitted_in_another_order_than_bound_still_get_their_gpus() -> None:
    async with running_node(gpus=8) as node:
        plan = {"a": [6, 7], "b": [2, 5], "c": [0, 3], "d": [1, 4]}
        for name, indices in plan.items():
            await node.bind(name, indices)
        for name in reversed(plan):  # kubelet's order is its own (e.g. one batch by creation time)
            assert await node.admit(name, 2) == node.ids(*plan[name]), name
        assert sample(node, "flexlease_deviceplugin_preferred_total", match="admitting") == 3.0
        assert node.plugin.reconciler is not None
        assert await node.plugin.reconciler.reconcile() == []


async def test_a_pod_kubelet_admits_before_the_pod_watch_shows_it_still_gets_its_gpus() -> None:
    """The agent's pod watch trails kubelet's: kubelet admits b while the book knows only a,
    which fits the request just as well. a is not in kubelet's pod manager (List), so it is
    not the pod being admitted: the plugin waits for the watch to show b."""
    async with running_node(gpus=4) as node:
        await node.bind("a", [0, 1])
        admission = asyncio.create_task(node.admit("b", 2))  # b not in the store yet
        await asyncio.sleep(0.2)  # kubelet is waiting in GetPreferredAllocation
        assert not admission.done()
        await node.bind("b", [2, 3])
        assert await asyncio.wait_for(admission, 5) == node.ids(2, 3)
        assert await node.admit("a", 2) == node.ids(0, 1)
        assert node.plugin.reconciler is not None
        assert await node.plugin.reconciler.reconcile() == []


async def test_a_pod_the_watch_never_shows_gets_the_fitting_pods_gpus_after_the_match_wait() -> None:
    """kubelet admits x, which the pod watch never shows (placed without the extender): after
    the match wait the answer is the one fitting pod's GPUs, as before, counted as unlisted."""
    async with running_node(gpus=4, device_plugin_match_wait_seconds=0.05) as node:
        await node.bind("a", [0, 1])
        assert await node.admit("x", 2) == node.ids(0, 1)
        assert sample(node, "flexlease_deviceplugin_preferred_total", match="unlisted") == 1.0
        assert sample(node, "flexlease_deviceplugin_preferred_total", match="unique") == 0.0


async def test_a_failing_pod_resources_list_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """List is asked on every preferred allocation: while it keeps failing, one warning."""
    async with running_node(gpus=2) as node:
        reconciler = node.plugin.reconciler
        assert reconciler is not None
        node.ctx.settings.agent.pod_resources_socket.unlink()  # kubelet's socket gone
        with caplog.at_level(logging.DEBUG, logger="nodeagent.deviceplugin.reconcile"):
            assert await reconciler.listed() is None
            assert await reconciler.listed() is None
        failed = [r.levelno for r in caplog.records if r.getMessage() == "PodResources List failed"]
        assert failed == [logging.WARNING, logging.DEBUG]


async def test_kubelet_admitting_another_pod_than_guessed_exchanges_the_assignments() -> None:
    async with running_node(gpus=4, device_plugin_match_wait_seconds=0.05) as node:
        await node.bind("x", [0, 1])
        await node.bind("y", [2, 3])
        # kubelet gives x the GPUs assigned to y, which is still waiting for admission
        got = await node.admit("x", 2, choose=lambda available, n: [node.uuids[2], node.uuids[3]])
        assert got == node.ids(2, 3)
        assert node.plugin.reconciler is not None and node.plugin.book is not None
        await node.plugin.reconciler.reconcile()
        (mismatch,) = await node.plugin.reconciler.reconcile()
        assert mismatch.key == "default/x"
        x = (await node.store.get(Kind.POD, "x", namespace="default"))["metadata"]["annotations"]
        y = (await node.store.get(Kind.POD, "y", namespace="default"))["metadata"]["annotations"]
        assert (x[keys.ANN_ASSIGNED_GPUS], y[keys.ANN_ASSIGNED_GPUS]) == (f"{NODE}:2,3", f"{NODE}:0,1")
        assert json.loads(y[keys.ANN_ASSIGNMENT_CORRECTED])["cause"] == "default/x"
        assert sample(node, "flexlease_deviceplugin_writebacks_total", result="ok") == 2.0
        book = node.plugin.book
        for _ in range(200):
            if book.uuids("default/y") == node.ids(0, 1):
                break
            await asyncio.sleep(0.005)
        # y is admitted onto its (exchanged) assignment and everything agrees
        assert await node.admit("y", 2) == node.ids(0, 1)
        assert await node.plugin.reconciler.reconcile() == []


async def test_pods_kubelet_still_lists_after_their_deletion_are_no_mismatch() -> None:
    async with running_node(gpus=2) as node:
        await node.bind("gone", [1])
        assert await node.admit("gone", 1) == node.ids(1)
        await node.store.delete(Kind.POD, "gone", namespace="default")
        assert node.plugin.reconciler is not None and node.plugin.book is not None
        for _ in range(200):
            if node.plugin.book.uuids("default/gone") is None:
                break
            await asyncio.sleep(0.005)
        # kubelet has not torn the pod down yet: it still lists it with its GPU
        assert await node.plugin.reconciler.reconcile() == []
        assert sample(node, "flexlease_deviceplugin_mismatches_total") == 0.0


@pytest.mark.containerd
async def test_a_gpu_container_that_dies_while_the_agent_is_away_is_restarted(
    cri: GrpcCri, containerd_testbed: ContainerdTestbed, standin_kubelet: KubeletFactory
) -> None:
    """The agent stops (a DaemonSet rollout, a crash, an OOM kill) and a trainer's process dies:
    kubelet restarts the container at once, holding the same GPU, without the agent — its
    plugin did not ask for PreStartContainer. (Registered with PreStartRequired, kubelet fails
    the start with CreateContainerConfigError until the agent is back.)"""
    async with running_node(gpus=2) as node:
        await node.bind("trainer-0", [1], image=containerd_testbed.trainer_v1)
        kubelet = standin_kubelet(node.store, NODE, devices=node.kubelet)
        await kubelet.sync_once()  # admitted through the agent's plugin, started
        sandbox = kubelet.sandbox_id("default", "trainer-0")
        [first] = [
            c for c in await cri.list_containers(sandbox_id=sandbox) if c.state is ContainerState.RUNNING
        ]
        env = await cri.exec_sync(first.id, ["sh", "-c", f"echo ${ENV_VISIBLE_DEVICES}"], timeout_seconds=5)
        assert env.stdout.strip() == node.uuids[1].encode()

        node.stop.set()  # the agent goes away
        await asyncio.wait_for(node.task, 10)
        plugin = node.kubelet.plugins[RESOURCE]
        async with asyncio.timeout(10):
            while not plugin.stopped:
                await plugin.changed.wait()
        await cri.stop_container(first.id, timeout_seconds=3)  # the trainer's process ends
        await kubelet.sync_once()

        running = [
            c for c in await cri.list_containers(sandbox_id=sandbox) if c.state is ContainerState.RUNNING
        ]
        failed = [e.message for e in kubelet.events if e.reason == "Failed"]
        assert not failed, failed
        [again] = running
        assert again.attempt == 1
        env = await cri.exec_sync(again.id, ["sh", "-c", f"echo ${ENV_VISIBLE_DEVICES}"], timeout_seconds=5)
        assert env.stdout.strip() == node.uuids[1].encode()  # the same GPU
        pod = await node.store.get(Kind.POD, "trainer-0", namespace="default")
        [status] = pod["status"]["containerStatuses"]
        assert "running" in status["state"] and status["restartCount"] == 1
