"""The projector: the log folded into PostgreSQL read models (jobs, nodes, attempts) and an audit archive.

``rows`` is pure (the shared ``ClusterState`` fold turned into rows), ``schema`` holds the idempotent
migrations, ``store`` the fenced batch transaction, ``projector`` the batching loop the service and
``rally projector`` drive. See docs/projector.md.
"""

from .metrics import QuarantineCollector
from .projector import LogReader, ProjectionError, Projector, RetryPolicy
from .rows import (
    Batch,
    ReadModel,
    RecordedLike,
    RefusedEvent,
    attempt_row,
    event_row,
    job_row,
    node_row,
    storable_text,
)
from .schema import (
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    MIGRATIONS,
    NODE_COLUMNS,
    QUARANTINE_COLUMNS,
    QUARANTINE_TABLE,
    SCHEMA,
)
from .store import (
    DATA_ERRORS,
    DEFAULT_NAME,
    TRANSIENT_ERRORS,
    PositionMoved,
    QuarantinedRow,
    Store,
    connect,
    fetch_archive_seqs,
    fetch_attempts,
    fetch_jobs,
    fetch_nodes,
    fetch_quarantined,
)

__all__ = [
    "ATTEMPT_COLUMNS",
    "DATA_ERRORS",
    "DEFAULT_NAME",
    "EVENT_COLUMNS",
    "JOB_COLUMNS",
    "MIGRATIONS",
    "NODE_COLUMNS",
    "QUARANTINE_COLUMNS",
    "QUARANTINE_TABLE",
    "SCHEMA",
    "TRANSIENT_ERRORS",
    "Batch",
    "LogReader",
    "PositionMoved",
    "ProjectionError",
    "Projector",
    "QuarantineCollector",
    "QuarantinedRow",
    "ReadModel",
    "RecordedLike",
    "RefusedEvent",
    "RetryPolicy",
    "Store",
    "attempt_row",
    "connect",
    "event_row",
    "fetch_archive_seqs",
    "fetch_attempts",
    "fetch_jobs",
    "fetch_nodes",
    "fetch_quarantined",
    "job_row",
    "node_row",
    "storable_text",
]
