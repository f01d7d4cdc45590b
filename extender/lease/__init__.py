"""The lease controller: right-of-return GPU leasing (WeFlex §3.2, §3.5; DESIGN §3).

``view`` derives a frozen picture of the cluster's GPUs from GPUNodes and pods, ``ledger``
reads an owner's lend history from its GPULeases, ``planner`` decides (pure: Lend, Reclaim,
tag release, standby pool), ``controller`` watches the store, reconciles and writes.
``workqueue`` is the controller's queue (its time is :mod:`flexlease.clock`); ``metrics`` its
Prometheus families. Entry point: :func:`extender.lease.controller.run` (or ``LeaseController``).
"""
