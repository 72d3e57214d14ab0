"""What every service is told on its command line (or environment)."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field

from rallypoint.eventlog.connection import NatsCredentials

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def _default_instance() -> str:
    # Unique per process on a host; in Kubernetes the pod name arrives through RALLY_INSTANCE.
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    service: str  # dashed name, as on the command line: "health-monitor"
    nats_url: str = DEFAULT_NATS_URL
    instance: str = ""
    log_level: str = "INFO"
    log_format: str = "json"  # "json": one JSON object per line; "text": one human line per record
    # Every service must agree on this: creating/updating the stream with another count would flip it.
    replicas: int = 1
    health_port: int | None = None  # serve GET /healthz here (Kubernetes and compose probes)
    # The service's own NATS user (None: whatever the URL carries); its password never on argv.
    nats_credentials: NatsCredentials | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.instance:
            object.__setattr__(self, "instance", _default_instance())

    @classmethod
    def from_args(cls, service: str, args: argparse.Namespace) -> ServiceConfig:
        return cls(
            service=service,
            nats_url=args.nats_url,
            instance=args.instance or "",
            log_level=args.log_level,
            log_format=args.log_format,
            replicas=args.replicas,
            health_port=args.health_port,
            nats_credentials=credentials_from_args(args),
        )


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every service shares; defaults come from RALLY_* environment variables."""
    env = os.environ
    parser.add_argument(
        "--nats-url",
        default=env.get("RALLY_NATS_URL", DEFAULT_NATS_URL),
        help="NATS server URL(s), comma separated (env RALLY_NATS_URL)",
    )
    parser.add_argument(
        "--instance",
        default=env.get("RALLY_INSTANCE", ""),
        help="instance id of this replica (env RALLY_INSTANCE; default host-pid)",
    )
    parser.add_argument(
        "--log-level",
        default=env.get("RALLY_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level (env RALLY_LOG_LEVEL)",
    )
    parser.add_argument(
        "--log-format",
        default=env.get("RALLY_LOG_FORMAT", "json"),
        choices=["json", "text"],
        help="log line format (env RALLY_LOG_FORMAT)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=int(env.get("RALLY_STREAM_REPLICAS", "1")),
        help="replicas of the event-log stream, the same for every service "
        "(env RALLY_STREAM_REPLICAS; 1 locally, 3 in production)",
    )
    parser.add_argument(
        "--nats-user",
        default=env.get("RALLY_NATS_USER", ""),
        help="NATS user of this service when the URL carries none (env RALLY_NATS_USER); "
        "its password comes from env RALLY_NATS_PASSWORD or --nats-password-file",
    )
    parser.add_argument(
        "--nats-password-file",
        default=env.get("RALLY_NATS_PASSWORD_FILE", ""),
        help="file holding the NATS user's password, e.g. a mounted secret (env RALLY_NATS_PASSWORD_FILE)",
    )
    health = env.get("RALLY_HEALTH_PORT")
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(health) if health else None,
        help="serve GET /healthz on this port (env RALLY_HEALTH_PORT; default: off)",
    )
    return parser


def credentials_from_args(args: argparse.Namespace) -> NatsCredentials | None:
    """``--nats-user`` with its password (env RALLY_NATS_PASSWORD or ``--nats-password-file``)."""
    user = getattr(args, "nats_user", "")
    if not user:
        return None
    return NatsCredentials.load(
        user, os.environ.get("RALLY_NATS_PASSWORD"), getattr(args, "nats_password_file", "") or None
    )


def nats_servers(url: str) -> list[str]:
    """``--nats-url`` accepts a comma-separated list (a cluster's seed servers)."""
    return [part.strip() for part in url.split(",") if part.strip()]
