"""What every service is told on its command line (or environment)."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rallypoint.eventlog.connection import NatsCredentials

from .priority import MAX_NICE

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

#: Seconds each service's connection waits after a read that emptied its socket (``eventlog.pacing``):
#: those whose reactions may come tens of milliseconds later, and the scheduler while it stands by (its
#: leader reads at once). Every other service is on a job's way to running, or answers people, and reads
#: at once; so do the services whose replicas share fenced partitions (checkpoint, health monitor): with
#: them paced, two bench runs at 12,500 nodes left a partition's last epoch in the log to a replica that
#: had lost its lease (docs/benchmarks.md, "Read pacing"). ``--read-pacing-ms`` overrides it per process.
READ_PACING_S: dict[str, float] = {
    "inventory": 0.02,
    "predictor": 0.02,
    "preemption": 0.02,
    "projector": 0.02,
    "scheduler": 0.02,
}


#: How much lower than the default CPU priority each service runs (``nice``; ``runtime.priority``): those
#: whose work may come later and whom nobody waits on (the PostgreSQL read model's writer, the eviction
#: reporter) yield the cores to those on a job's way to running where services share them. Every other
#: service runs at 0: the predictor and the inventory too (the API waits on their answers, a second at
#: most), and the checkpoint service (its replicas' fenced partitions hold leases that must not wait on
#: the CPU). ``--nice`` overrides it.
CPU_NICE: dict[str, int] = {
    "preemption": 10,
    "projector": 10,
}


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
    #: the connection's read pacing in seconds (None: the service's own, ``READ_PACING_S``)
    read_pacing_s: float | None = None
    #: the process's CPU niceness (None: the service's own, ``CPU_NICE``)
    nice: int | None = None

    def __post_init__(self) -> None:
        if not self.instance:
            object.__setattr__(self, "instance", _default_instance())

    @property
    def pacing_s(self) -> float:
        """How long this service's connection lets a trickle of messages gather before reading them."""
        return READ_PACING_S.get(self.service, 0.0) if self.read_pacing_s is None else self.read_pacing_s

    @property
    def niceness(self) -> int:
        """How much lower than the default CPU priority this service runs (``runtime.priority``)."""
        return CPU_NICE.get(self.service, 0) if self.nice is None else self.nice

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
            read_pacing_s=None if args.read_pacing_ms is None else args.read_pacing_ms / 1000,
            nice=args.nice,
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
    _service_own(
        parser,
        "--read-pacing-ms",
        "RALLY_READ_PACING_MS",
        _pacing_ms,
        "after a read that emptied the NATS socket, wait this long before the next, so a trickle of "
        "events is read in one go (0: read at once)",
    )
    _service_own(
        parser,
        "--nice",
        "RALLY_NICE",
        _niceness,
        "run at this CPU niceness, 0 to 19: a background service yields the cores to those a job waits on",
    )
    health = env.get("RALLY_HEALTH_PORT")
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(health) if health else None,
        help="serve GET /healthz on this port (env RALLY_HEALTH_PORT; default: off)",
    )
    return parser


def _service_own(
    parser: argparse.ArgumentParser, flag: str, env_name: str, convert: Callable[[str], Any], help: str
) -> None:
    """An option whose default is the environment's, else None: each service's own then applies."""
    raw = os.environ.get(env_name)
    parser.add_argument(
        flag,
        type=convert,
        default=convert(raw) if raw else None,
        help=f"{help} (env {env_name}; default: the service's own, docs/deployment.md)",
    )


def _niceness(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: a whole number from 0 to {MAX_NICE}") from None
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(f"{text}: a niceness from 0 to {MAX_NICE} (never above the default)")
    return value


def _pacing_ms(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{text}: milliseconds from 0 to 1000")
    return value


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
