"""Finding the cluster a command talks to: flag > environment > .rally/cluster.json > default."""

from __future__ import annotations

import json
import os
from pathlib import Path

CLUSTER_FILE = Path(".rally") / "cluster.json"


def cluster_info() -> dict[str, object]:
    try:
        data = json.loads(CLUSTER_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def default_nats_url() -> str:
    env = os.environ.get("RALLY_NATS_URL")
    if env:
        return env
    return str(cluster_info().get("nats_url") or "nats://127.0.0.1:4222")


def default_postgres_dsn() -> str | None:
    """RALLY_POSTGRES_DSN, else the read models of the `rally up` in this folder, else None."""
    env = os.environ.get("RALLY_POSTGRES_DSN")
    if env:
        return env
    dsn = cluster_info().get("postgres_dsn")
    return str(dsn) if dsn else None
