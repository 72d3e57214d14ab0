"""The projector: the log folded into PostgreSQL read models (jobs, nodes, attempts) and an audit archive.

``rows`` is pure (the shared ``ClusterState`` fold turned into rows), ``schema`` holds the idempotent
migrations, ``store`` the fenced batch transaction, ``projector`` the batching loop the service and
``rally projector`` drive. See docs/projector.md.
"""

from .projector import LogReader, ProjectionError, Projector, RetryPolicy
from .rows import Batch, ReadModel, RecordedLike, attempt_row, event_row, job_row, node_row
from .schema import ATTEMPT_COLUMNS, EVENT_COLUMNS, JOB_COLUMNS, MIGRATIONS, NODE_COLUMNS, SCHEMA
from .store import (
    DEFAULT_NAME,
    TRANSIENT_ERRORS,
    PositionMoved,
    Store,
    connect,
    fetch_archive_seqs,
    fetch_attempts,
    fetch_jobs,
    fetch_nodes,
)

__all__ = [
    "ATTEMPT_COLUMNS",
    "DEFAULT_NAME",
    "EVENT_COLUMNS",
    "JOB_COLUMNS",
    "MIGRATIONS",
    "NODE_COLUMNS",
    "SCHEMA",
    "TRANSIENT_ERRORS",
    "Batch",
    "LogReader",
    "PositionMoved",
    "ProjectionError",
    "Projector",
    "ReadModel",
    "RecordedLike",
    "RetryPolicy",
    "Store",
    "attempt_row",
    "connect",
    "event_row",
    "fetch_archive_seqs",
    "fetch_attempts",
    "fetch_jobs",
    "fetch_nodes",
    "job_row",
    "node_row",
]
