"""JetStream client of the event log: stream setup, conditional append, gapless replay, follow,
snapshots. See docs/architecture.md for the contract."""

from .connection import NatsCredentials, connect_nats
from .errors import (
    CONCURRENT_WRITE,
    CONFLICT_CODES,
    WRONG_LAST_SEQUENCE,
    AppendConflict,
    EventLogError,
    LogGap,
    LogUnavailable,
    UndecodableEvent,
)
from .log import AppendResult, EventLog, Recorded, stored
from .snapshots import SNAPSHOT_BUCKET, SnapshotStore

__all__ = [
    "CONCURRENT_WRITE",
    "CONFLICT_CODES",
    "SNAPSHOT_BUCKET",
    "WRONG_LAST_SEQUENCE",
    "AppendConflict",
    "AppendResult",
    "EventLog",
    "EventLogError",
    "LogGap",
    "LogUnavailable",
    "NatsCredentials",
    "Recorded",
    "SnapshotStore",
    "UndecodableEvent",
    "connect_nats",
    "stored",
]
