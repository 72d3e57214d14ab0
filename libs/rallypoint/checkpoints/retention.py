"""What the checkpoint service must do for one job, as a pure function of the job's folded checkpoints.

Level-triggered like ``rallypoint.control.reconcile``: ``plan_checkpoints(job, policy)`` looks at what the
log says each step *is* and returns the work that brings the disk in line. Nothing is remembered between
calls, so a restarted service simply plans again; every action is idempotent.

The rules, in order:

1. A step the training client committed (status ``committed``) is verified: its manifest and every shard
   are re-read before anything relies on it.
2. A step found ``corrupt`` is deleted: nothing may resume from it, and its files only cost disk.
3. Retention keeps the newest ``keep`` *complete* steps (committed or verified) and deletes older complete
   ones. A corrupt step is never complete, so it never counts towards ``keep``: when the newest steps are
   corrupt, the newest complete one is kept however old it is. With ``keep >= 1`` the newest complete
   step is therefore never deleted.
4. A committed step is only probably complete until verified: every kept step might still turn out
   corrupt. So when none of the kept steps is verified yet, retention also keeps the newest verified
   step among the older ones, and when the job has no verified step at all it deletes nothing until
   one is: no deletion may leave the job without a complete checkpoint, whatever the pending
   verifications find.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from rallypoint.state import CheckpointView, ClusterState, JobView

DEFAULT_KEEP = 3

#: ``CheckpointDeleted.reason`` prefixes; the rest of the reason says which rule applied.
REASON_RETENTION = "retention"
REASON_CORRUPT = "corrupt"


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    keep: int = DEFAULT_KEEP  # complete checkpoints kept per job, the newest ones

    def __post_init__(self) -> None:
        if self.keep < 1:
            # keep=0 would delete the newest complete checkpoint: the one every restart resumes from.
            raise ValueError(f"keep must be at least 1, got {self.keep}")


class Verify(msgspec.Struct, frozen=True, kw_only=True):
    """Re-read the step's manifest and shards; the manifest's digest must be ``manifest_sha256``."""

    job_id: str
    step: int
    path: str
    manifest_sha256: str


class Delete(msgspec.Struct, frozen=True, kw_only=True):
    """Remove the step's folder and record ``CheckpointDeleted(reason)``."""

    job_id: str
    step: int
    path: str
    manifest_sha256: str  # the committed manifest: a folder holding another one is not this checkpoint
    reason: str


class CheckpointPlan(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    verify: tuple[Verify, ...] = ()
    delete: tuple[Delete, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.verify and not self.delete


def plan_checkpoints(job: JobView, policy: RetentionPolicy) -> CheckpointPlan:
    """The verifications and deletions ``job``'s checkpoints need now (rules in the module docstring)."""
    verify = tuple(_verify(job.job_id, c) for c in job.checkpoints if c.status == "committed")
    corrupt = [
        _delete(job.job_id, c, f"{REASON_CORRUPT}: {c.error or 'verification failed'}")
        for c in job.checkpoints
        if c.status == "corrupt"
    ]
    return CheckpointPlan(
        job_id=job.job_id, verify=verify, delete=tuple(corrupt) + _retention(job, policy.keep)
    )


def plan_jobs(state: ClusterState, job_ids: Iterable[str], policy: RetentionPolicy) -> list[CheckpointPlan]:
    """Plans of the given jobs that have work, in job id order (unknown ids are skipped)."""
    plans = []
    for job_id in sorted(set(job_ids)):
        job = state.jobs.get(job_id)
        if job is None:
            continue
        plan = plan_checkpoints(job, policy)
        if not plan.empty:
            plans.append(plan)
    return plans


def _retention(job: JobView, keep: int) -> tuple[Delete, ...]:
    complete = sorted((c for c in job.checkpoints if c.complete), key=lambda c: c.step)
    kept, older = complete[-keep:], complete[:-keep]
    if older and not any(c.status == "verified" for c in kept):
        verified = [c for c in older if c.status == "verified"]
        if not verified:
            return ()  # nothing proven complete yet: wait for a verification
        older.remove(verified[-1])  # the fallback should every kept step turn out corrupt
    if not older:
        return ()
    reason = f"{REASON_RETENTION}: older than the newest {keep} complete checkpoints"
    return tuple(_delete(job.job_id, c, reason) for c in older)


def _verify(job_id: str, checkpoint: CheckpointView) -> Verify:
    return Verify(
        job_id=job_id,
        step=checkpoint.step,
        path=checkpoint.path,
        manifest_sha256=checkpoint.manifest_sha256,
    )


def _delete(job_id: str, checkpoint: CheckpointView, reason: str) -> Delete:
    return Delete(
        job_id=job_id,
        step=checkpoint.step,
        path=checkpoint.path,
        manifest_sha256=checkpoint.manifest_sha256,
        reason=reason,
    )
