"""Trace-driven cluster simulator (WeFlex §4): plays kube-scheduler against the real extender.

``python -m flexlease.sim --nodes 64 --days 60 --out DIR`` runs right-of-return leasing and
plain leasing on the same inputs and writes ``report.json``, ``ha_share.png`` (Fig. 14) and
``lp_fulfilment.png`` (Fig. 10). Modules:

* pure model (no I/O): :mod:`~flexlease.sim.traces` (LP arrivals from the public traces,
  scaled; utilisation signals; synthetic fallback), :mod:`~flexlease.sim.tide` (Fig. 2 demand,
  the irregular stress tide, §4.4 scale policy), :mod:`~flexlease.sim.failures` (failure
  process calibrated to Fig. 5),
  :mod:`~flexlease.sim.tiering` (availability and tiers over the rolling window),
  :mod:`~flexlease.sim.metrics` (what is measured), :mod:`~flexlease.sim.objects` (Pods,
  GPUNodes, GPULeases as JSON), :mod:`~flexlease.sim.scenario` (parameters);
* I/O edges: :mod:`~flexlease.sim.extender_client` (the extender HTTP protocol, scheduler
  side), :mod:`~flexlease.sim.driver` (the virtual-clock loop, invariants; right-of-return's
  from :mod:`flexlease.rightofreturn`, observed after every step),
  :mod:`~flexlease.sim.runner` (one store, clock and hosted extender per policy),
  :mod:`~flexlease.sim.report` (JSON, plots, table); :mod:`~flexlease.sim.extender_proc`
  starts the extender as a subprocess (used by the demo).

``flexlease`` never imports ``extender``: the runner loads ``extender.simhost`` by name, which
serves the real extender app on loopback HTTP on the simulation's clock; the simulator
reaches it over HTTP and through the shared in-memory store only.
"""
