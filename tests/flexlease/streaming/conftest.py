"""A real nats-server per test (tests/natsserver.py)."""

from tests.natsserver import nats_server

__all__ = ["nats_server"]
