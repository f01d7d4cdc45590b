"""Topology-aware orchestration (WeFlex §3.4, DESIGN §3): launch a job's framework commands in
dependency order, only when the pods they need are ready.

- :mod:`~extender.orchestrator.profile`: framework dependency profiles (YAML → validated
  :class:`~extender.orchestrator.profile.Profile`); shipped: ``profiles/{mpi,pytorch,ray,tensorflow}.yaml``.
- :mod:`~extender.orchestrator.dag`: the command DAG (stdlib ``graphlib``) and precondition checks. Pure.
- :mod:`~extender.orchestrator.snapshot` / :mod:`~extender.orchestrator.template`: the readiness
  snapshot and command templates. Pure.
- :mod:`~extender.orchestrator.watch`: keeps the snapshot current from a store watch filtered by role labels.
- :mod:`~extender.orchestrator.runner`: executes the DAG with retries, back-off, a step log and a final
  state per command, through an :mod:`~extender.orchestrator.executors` executor (CRI ExecSync or
  Kubernetes exec).
"""
