"""The node agent, ``flexlease-agent``: a DaemonSet on the GPU nodes labelled
``flexlease.io/device-plugin=true`` (``manifests/base/agent/daemonset.yaml``).

:mod:`nodeagent.main` is the entry point; :mod:`nodeagent.agent`, the composition root, runs
these components on one shared :class:`~nodeagent.context.AgentContext`:

- ``health`` and ``ledger`` (:mod:`nodeagent.health`): NVML health through a real or
  simulated backend, the per-GPU health policy and board, and the availability ledger
  (:mod:`nodeagent.ledger`: availability ratio and reliability tier, kept on local disk);
- ``status`` (:mod:`nodeagent.status`): this node's ``GPUNode.status``;
- ``metrics`` (:mod:`nodeagent.metrics`): ``/metrics``, ``/healthz``, ``/readyz``;
- ``deviceplugin`` (:mod:`nodeagent.deviceplugin`, with ``agent.device_plugin``): kubelet's
  device-plugin API for the GPU resource, honouring the extender's per-device assignment;
- ``cache`` and ``hotrestart`` (:mod:`nodeagent.cache`, :mod:`nodeagent.hotrestart`, over CRI
  through :mod:`nodeagent.cri`): image pre-pull, the checkpoint cache, and hot restarts
  (``direct`` in flexlease's own sandboxes, ``kubelet`` everywhere else); with
  ``agent.staging_nats_url``, streaming-data staging around each hot restart
  (:mod:`nodeagent.staging`) and the prelaunch for reclaim pods (:mod:`nodeagent.reclaim`).

:mod:`nodeagent.prelaunch` holds the prelaunch window W and the standby prewarm command.
"""
