"""The events the checkpoint service appends, built from a plan's actions and what the disk said.

Pure: the shell reads the files (``rallypoint.ckpt.verify_checkpoint``) and removes folders; what that
means for the log is decided here, so a replay or a test can recompute it.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Protocol

from rallypoint.events import CheckpointDeleted, CheckpointVerified

from .retention import Delete, Verify

# The training client's step folder: ``<checkpoint_dir>/step-<12-digit step>`` (docs/training-client.md).
_STEP_FOLDER = re.compile(r"^step-(\d{12,})$")


class VerifyOutcome(Protocol):
    """The shape of ``rallypoint.ckpt.VerifyResult`` this module reads."""

    @property
    def ok(self) -> bool: ...
    @property
    def error(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def manifest_sha256(self) -> str: ...


def verified_msg_id(job_id: str, step: int) -> str:
    return f"{job_id}:ckpt:{step}:verified"


def deleted_msg_id(job_id: str, step: int) -> str:
    return f"{job_id}:ckpt:{step}:deleted"


def mismatch(task: Verify, outcome: VerifyOutcome) -> str:
    """Why a readable checkpoint is still not the one the log recorded ("" when it is)."""
    if not outcome.ok:
        return outcome.error or "verification failed"
    # The manifest's digest ties the files to the commit event: a folder rewritten since (a second
    # attempt saving the same step, a copy gone wrong) must not pass for the committed checkpoint.
    if outcome.manifest_sha256 != task.manifest_sha256:
        return (
            f"manifest sha256 {outcome.manifest_sha256[:12]} differs from the committed "
            f"{task.manifest_sha256[:12]}"
        )
    if outcome.step is not None and outcome.step != task.step:
        return f"manifest is for step {outcome.step}, committed as step {task.step}"
    return ""


def verified_event(task: Verify, outcome: VerifyOutcome, at: float) -> CheckpointVerified:
    error = mismatch(task, outcome)
    return CheckpointVerified(job_id=task.job_id, step=task.step, ok=not error, error=error, at=at)


def deleted_event(task: Delete, at: float, *, left_because: str = "") -> CheckpointDeleted:
    """The deletion as recorded; ``left_because`` says why the files were not removed (see below)."""
    reason = f"{task.reason}; files left in place: {left_because}" if left_because else task.reason
    return CheckpointDeleted(job_id=task.job_id, step=task.step, reason=reason, at=at)


def keep_files_because(task: Delete, manifest_sha256: str | None) -> str:
    """Why the folder at ``task.path`` must not be removed ("" when it may be).

    ``manifest_sha256`` is the digest of the folder's manifest now (None: there is none). The path comes
    from an event the node agent appended: a wrong one (``/``, a job's whole checkpoint folder) must never
    reach ``rmtree``. And a folder whose manifest is no longer the committed one holds a later save of
    the same step (a retried attempt re-saving it), which is not this checkpoint's to delete.
    """
    if not is_step_folder(task.path, task.step):
        return f"{task.path} is not the folder of step {task.step}"
    if manifest_sha256 is not None and manifest_sha256 != task.manifest_sha256:
        return "its manifest was rewritten after the commit"
    return ""


def is_step_folder(path: str, step: int) -> bool:
    """Whether ``path`` is an absolute path naming the folder of ``step`` (``.../step-<12 digits>``)."""
    pure = PurePath(path)
    match = _STEP_FOLDER.match(pure.name)
    return pure.is_absolute() and match is not None and int(match.group(1)) == step
