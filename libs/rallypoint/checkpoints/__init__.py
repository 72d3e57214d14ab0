"""The checkpoint service's decisions (no I/O): what to verify, what to delete, which events say so."""

from .retention import (
    DEFAULT_KEEP,
    REASON_CORRUPT,
    REASON_RETENTION,
    CheckpointPlan,
    Delete,
    RetentionPolicy,
    Verify,
    plan_checkpoints,
    plan_jobs,
)
from .verdict import (
    VerifyOutcome,
    deleted_event,
    deleted_msg_id,
    is_step_folder,
    keep_files_because,
    mismatch,
    verified_event,
    verified_msg_id,
)

__all__ = [
    "DEFAULT_KEEP",
    "REASON_CORRUPT",
    "REASON_RETENTION",
    "CheckpointPlan",
    "Delete",
    "RetentionPolicy",
    "Verify",
    "VerifyOutcome",
    "deleted_event",
    "deleted_msg_id",
    "is_step_folder",
    "keep_files_because",
    "mismatch",
    "plan_checkpoints",
    "plan_jobs",
    "verified_event",
    "verified_msg_id",
]
