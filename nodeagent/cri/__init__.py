"""CRI (Container Runtime Interface, ``runtime.v1``) access for the node agent.

``api.proto`` is a hand-written, wire-compatible subset of the upstream CRI proto;
``api_pb2*`` are generated from it by ``hack/gen-proto.sh``. :mod:`nodeagent.cri.client`
holds the narrow Protocols the agent codes against (only the calls it makes) and the gRPC
implementation; :mod:`nodeagent.cri.fake` is an in-memory implementation for unit tests of
the logic above it.
"""
