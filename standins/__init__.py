"""Faithful local stand-ins for cluster components that cannot run here (a kubelet), speaking
the real protocols with real payloads, for tests, benches and the demo. Production packages
(``flexlease``, ``extender``, ``nodeagent``) never import this package.

:mod:`~standins.kubelet_pods`: kubelet's container lifecycle on a real CRI runtime.
:mod:`~standins.kubelet_devices`: kubelet's device-plugin side (Registration on
``kubelet.sock``, driving a plugin's ListAndWatch/GetPreferredAllocation/Allocate/
PreStartContainer, restarts) and its PodResources API.
"""
