"""The control plane, ``flexlease-extender`` (:mod:`extender.main`).

- The kube-scheduler HTTP extender (:mod:`extender.server`): ``filter``, ``prioritize``,
  ``preempt`` and ``bind`` over the in-memory inventory (:mod:`extender.state`), with
  Algorithm 1 as pure functions (:mod:`extender.scheduling`), per-class filter results
  (:mod:`extender.equivalence`) and the binder (:mod:`extender.binder`); callers checked by
  mutual TLS and :mod:`extender.admission` (:mod:`extender.tls`), probes and metrics on a
  read-only listener (:mod:`extender.probes`, :mod:`extender.metrics`).
- The lease controller (:mod:`extender.lease`): lend, reclaim and the standby pool, run
  in the same process (with leader election, only on the leading replica).
- The orchestrator (:mod:`extender.orchestrator`): framework profiles, the command DAG and its
  runner; a library the extender process does not run yet.
- :mod:`extender.simhost`: the same app hosted in a simulation on a virtual clock.
"""
