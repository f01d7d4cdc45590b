"""In-sandbox hot restart (WeFlex §3.3, DESIGN §4): on a pod's ``flexlease.io/hot-restart``
request the agent pre-pulls the image and restarts only that container inside the existing
sandbox, keeping the pod UID, sandbox, IP, volumes, IPC and GPU binding.

:mod:`~nodeagent.hotrestart.model` (annotations), :mod:`~nodeagent.hotrestart.decide` (pure
decisions), :mod:`~nodeagent.hotrestart.restarter` (CRI I/O),
:mod:`~nodeagent.hotrestart.controller` (watch + reconcile + status),
:mod:`~nodeagent.hotrestart.component` (agent wiring).
"""
