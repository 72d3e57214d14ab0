"""``--stale`` for the commands that read the API's fold (`rally jobs`, `nodes`, `checkpoints`, `queues`).

By default the API answers a read only once its fold holds every write acknowledged before it, which
needs the event log: while NATS is unreachable every read is a 503 ``log-unavailable``. ``--stale`` asks
for the API's last known view instead (``?stale=true``, docs/api.md "Reading what was written"), and a
read refused that way says so, so whoever is looking at an outage learns the flag exists.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from .client import ApiError, ApiUnreachable

LOG_UNAVAILABLE = "log-unavailable"  # the problem slug of services/api/problems.py's ``unavailable``


def add_stale_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stale",
        action="store_true",
        help="answer from the API's last known view without asking the event log (works while NATS is "
        "unreachable; may miss the latest writes)",
    )


def log_unavailable(err: ApiError) -> bool:
    kind = err.problem.get("type")
    return err.status == 503 and isinstance(kind, str) and kind.rsplit("/", 1)[-1] == LOG_UNAVAILABLE


def error_line(err: ApiError | ApiUnreachable, args: argparse.Namespace) -> str:
    """The error's line, and for a read refused because the log is unreachable, the way to see anyway
    (only for a command that has ``--stale`` and was run without it)."""
    line = err.line()
    offered = getattr(args, "stale", None) is False
    if isinstance(err, ApiError) and offered and log_unavailable(err):
        line += "\nhint: rerun with --stale to see this API's last known view (it may miss the latest writes)"
    return line


def note_stale(args: argparse.Namespace, body: Mapping[str, Any]) -> None:
    """On stderr (the output stays parseable): what a --stale answer is."""
    if not getattr(args, "stale", False):
        return
    seq = body.get("seq")
    where = f" at log position {seq}" if isinstance(seq, int) else ""
    print(f"note: --stale: this API's last known view{where}; it may miss the latest writes", file=sys.stderr)
