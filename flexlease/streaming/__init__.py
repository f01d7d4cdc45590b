"""Streaming-data staging (WeFlex §3.3): the broker seam (:mod:`.broker`), its NATS JetStream
implementation (:mod:`.jetstream`), a job's stream binding and W_stage (:mod:`.config`), and
the training-side source that commits offsets after each step (:mod:`.source`). The node
agent's staging side is :mod:`nodeagent.staging`."""
