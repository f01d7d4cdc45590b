"""Control plane: the kube-scheduler HTTP extender, the lease controller and the orchestrator."""
