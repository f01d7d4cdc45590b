"""The device plugin's Prometheus metrics (prefix ``flexlease_``, injected registry, label
``node``; never a pod UID):

=================================================  =======  ==========================================
``flexlease_deviceplugin_registrations_total``     counter  Register calls to kubelet (``result``: ok,
                                                            error)
``flexlease_deviceplugin_registered``              gauge    1 while registered with kubelet
``flexlease_deviceplugin_devices``                 gauge    devices last sent by ListAndWatch, by
                                                            ``health`` (Healthy, Unhealthy)
``flexlease_deviceplugin_preferred_total``         counter  GetPreferredAllocation answers by
                                                            ``match`` (pinned, unique, admitting,
                                                            unfit, ordered, none, unlisted: the
                                                            match wait ran out on a pod kubelet
                                                            does not list)
``flexlease_deviceplugin_allocations_total``       counter  Allocate container requests by ``result``
                                                            (matched: the devices are one pod's
                                                            assignment; unmatched: they are not)
``flexlease_deviceplugin_mismatches_total``        counter  pods kubelet gave other GPUs than
                                                            assigned (PodResources), each counted once
``flexlease_deviceplugin_writebacks_total``        counter  corrected assignments written (``result``:
                                                            ok, error)
``flexlease_deviceplugin_kubelet_allocatable``     gauge    devices kubelet reports allocatable
                                                            (GetAllocatableResources)
=================================================  =======  ==========================================
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from nodeagent.deviceplugin.matching import PreferenceKind

PREFIX: Final = "flexlease_deviceplugin_"
UNLISTED: Final = "unlisted"
"""``match`` of a preferred allocation made when the match wait ran out while the pod it
names is not in kubelet's PodResources ``List`` (so likely not the pod being admitted)."""


class DevicePluginMetrics:
    """Counters and gauges of the device plugin of node ``node``, registered in ``registry``
    with every known label value pre-initialised."""

    def __init__(self, registry: CollectorRegistry, node: str) -> None:
        self.node = node
        self.registrations = Counter(
            PREFIX + "registrations",
            "Register calls to kubelet by result.",
            ["node", "result"],
            registry=registry,
        )
        self.registered = Gauge(
            PREFIX + "registered",
            "1 while the plugin is registered with kubelet.",
            ["node"],
            registry=registry,
        )
        self.devices = Gauge(
            PREFIX + "devices",
            "Devices last sent to kubelet by ListAndWatch, by health.",
            ["node", "health"],
            registry=registry,
        )
        self.preferred = Counter(  # match: a PreferenceKind's value, or UNLISTED
            PREFIX + "preferred",
            "GetPreferredAllocation answers by how the pod was matched.",
            ["node", "match"],
            registry=registry,
        )
        self.allocations = Counter(
            PREFIX + "allocations",
            "Allocate container requests by whether the devices are one pod's assignment.",
            ["node", "result"],
            registry=registry,
        )
        self.mismatches = Counter(
            PREFIX + "mismatches",
            "Pods that kubelet gave other GPUs than the extender assigned (read from PodResources).",
            ["node"],
            registry=registry,
        )
        self.writebacks = Counter(
            PREFIX + "writebacks",
            "Corrected assignments written back to pods, by result.",
            ["node", "result"],
            registry=registry,
        )
        self.kubelet_allocatable = Gauge(
            PREFIX + "kubelet_allocatable",
            "Devices of the resource kubelet reports allocatable (PodResources GetAllocatableResources).",
            ["node"],
            registry=registry,
        )
        for result in ("ok", "error"):
            self.registrations.labels(node=node, result=result)
            self.writebacks.labels(node=node, result=result)
        for health in ("Healthy", "Unhealthy"):
            self.devices.labels(node=node, health=health)
        for match in (*(kind.value for kind in PreferenceKind), UNLISTED):
            self.preferred.labels(node=node, match=match)
        for result in ("matched", "unmatched"):
            self.allocations.labels(node=node, result=result)
        self.mismatches.labels(node=node)
        self.registered.labels(node=node).set(0)
        self.kubelet_allocatable.labels(node=node)
