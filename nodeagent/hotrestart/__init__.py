"""Hot restart (WeFlex §3.3, DESIGN §4): on a pod's ``flexlease.io/hot-restart`` request the
agent pre-pulls the image and restarts only that container inside the existing sandbox,
keeping the pod UID, sandbox, IP, volumes, IPC and GPU binding. Two strategies
(:class:`~nodeagent.hotrestart.model.Strategy`): ``kubelet`` patches the pod spec's image and
confirms kubelet's own in-place restart; ``direct`` replaces the container through CRI, only in
sandboxes no kubelet manages.

:mod:`~nodeagent.hotrestart.model` (annotations), :mod:`~nodeagent.hotrestart.decide` and
:mod:`~nodeagent.hotrestart.kubelet` (pure decisions), :mod:`~nodeagent.hotrestart.restarter`
(CRI I/O), :mod:`~nodeagent.hotrestart.queue` (the work queue),
:mod:`~nodeagent.hotrestart.controller` (watch + reconcile + status),
:mod:`~nodeagent.hotrestart.component` (agent wiring).
"""
