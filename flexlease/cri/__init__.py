"""The CRI (Container Runtime Interface, ``runtime.v1``) wire contract, shared by both deployables.

``api.proto`` is a hand-written, wire-compatible subset of the upstream CRI proto;
``api_pb2*`` are generated from it by ``hack/gen-proto.sh``. It lives here, not in a
deployable, because a protobuf file can be registered only once per process: the node
agent's client (:mod:`nodeagent.cri.client`) and the orchestrator's ExecSync executor
(:mod:`extender.orchestrator.executors`) must use one generated module. Messages and stubs
only; no I/O happens on import.
"""
