"""The lease autopilot (issue #40): ``GPULeasePolicy`` → demand → plan → ``GPULease``.

Pure logic, each its own module: :mod:`~extender.autopilot.schedule`,
:mod:`~extender.autopilot.promql`, :mod:`~extender.autopilot.forecast` (the three demand
sources' arithmetic), :mod:`~extender.autopilot.stabilize` (KALE's plan stabilization),
:mod:`~extender.autopilot.leadtime` (W of formulas 1–3 plus the grace period),
:mod:`~extender.autopilot.plan` (plan, target, decision). At the edges:
:mod:`~extender.autopilot.prometheus` (the metrics seam and its Prometheus client),
:mod:`~extender.autopilot.demand` (reading a policy's source), :mod:`~extender.autopilot.metrics`
and :mod:`~extender.autopilot.controller` (the reconcile loop, in the extender's leader).
"""
