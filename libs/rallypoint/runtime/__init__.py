"""The service shell: config and arguments, structured logs, signals, connections, leader lease."""

from .config import DEFAULT_NATS_URL, ServiceConfig, add_common_args, nats_servers
from .leader import LEADER_BUCKET, LeaderLease
from .logs import JsonLineFormatter, TextLineFormatter, setup_logging
from .service import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, ServiceContext, run_service, run_service_async

__all__ = [
    "DEFAULT_NATS_URL",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "LEADER_BUCKET",
    "JsonLineFormatter",
    "LeaderLease",
    "ServiceConfig",
    "ServiceContext",
    "TextLineFormatter",
    "add_common_args",
    "nats_servers",
    "run_service",
    "run_service_async",
    "setup_logging",
]
