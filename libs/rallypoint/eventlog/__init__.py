"""JetStream client of the event log: stream setup, conditional append, gapless replay, follow,
snapshots. See docs/architecture.md for the contract."""

from .connection import NatsCredentials, connect_nats
from .errors import (
    CONCURRENT_WRITE,
    CONFLICT_CODES,
    DUPLICATE_IN_BATCH,
    WRONG_LAST_SEQUENCE,
    AppendConflict,
    BatchTooLarge,
    EventLogError,
    LogGap,
    LogUnavailable,
    UndecodableEvent,
)
from .log import (
    MAX_BATCH,
    Append,
    AppendResult,
    BatchResult,
    Entry,
    EventLog,
    Recorded,
    stored,
    subject_matches,
)
from .snapshots import SNAPSHOT_OBJECT, SnapshotStore, StateSnapshot

__all__ = [
    "CONCURRENT_WRITE",
    "CONFLICT_CODES",
    "DUPLICATE_IN_BATCH",
    "MAX_BATCH",
    "SNAPSHOT_OBJECT",
    "WRONG_LAST_SEQUENCE",
    "Append",
    "AppendConflict",
    "AppendResult",
    "BatchResult",
    "BatchTooLarge",
    "Entry",
    "EventLog",
    "EventLogError",
    "LogGap",
    "LogUnavailable",
    "NatsCredentials",
    "Recorded",
    "SnapshotStore",
    "StateSnapshot",
    "UndecodableEvent",
    "connect_nats",
    "stored",
    "subject_matches",
]
