"""Carrying out a ``CheckpointPlan``: read the files, remove folders, append what happened.

The decisions (what to verify, what to delete, what a verification result means) are
``rallypoint.checkpoints``; this module only does the I/O. File work runs in worker threads: reading
every shard of a large checkpoint must not stall the event loop that follows the log.

With ``partitions`` (several replicas), a job's work is done only while this replica owns the job's
partition: each verification and removal asks just before its file work (a partition may move while the
work waits for the disk), and every append is fenced by the partition's ownership epoch
(``runtime.partitions``), so a deposed owner's append is refused by the server and it drops the partition.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rallypoint.checkpoints import (
    CheckpointPlan,
    Delete,
    Verify,
    VerifyOutcome,
    deleted_event,
    deleted_msg_id,
    is_step_folder,
    keep_files_because,
    verified_event,
    verified_msg_id,
)
from rallypoint.ckpt import MANIFEST
from rallypoint.ckpt.manifest import sha256_file
from rallypoint.eventlog import EventLog
from rallypoint.events import CheckpointEvent, subjects
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.partitions import NotOwner, PartitionOwnership

_log = logging.getLogger("rallypoint.checkpoint")

SOURCE = "rallypoint/checkpoint"

Verifier = Callable[[str], VerifyOutcome]


class CheckpointActions:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        verifier: Verifier,
        *,
        clock: Callable[[], float] = time.time,
        max_parallel: int = 2,
        partitions: PartitionOwnership | None = None,
    ) -> None:
        self.log = log
        self.follower = follower
        self.verifier = verifier
        self.clock = clock
        self.partitions = partitions  # None: one replica, every job ours, appends unfenced
        # Verifications read every byte of a checkpoint: a few at a time keeps the disk usable.
        self._disk = asyncio.Semaphore(max_parallel)

    async def carry_out(self, plan: CheckpointPlan) -> None:
        """Every verification, then every deletion (the plan is safe whatever the verifications find)."""
        await asyncio.gather(*(self.verify(task) for task in plan.verify))
        for task in plan.delete:
            await self.delete(task)

    def owns(self, job_id: str) -> bool:
        return self.partitions is None or self.partitions.owns(job_id)

    def _still_ours(self, job_id: str) -> None:
        """NotOwner unless the job's partition is ours now: no file work for a job another replica owns."""
        if not self.owns(job_id):
            raise NotOwner(job_id)

    async def verify(self, task: Verify) -> None:
        async with self._disk:
            self._still_ours(task.job_id)  # the wait for the disk may have outlasted our ownership
            outcome = await asyncio.to_thread(self.verifier, task.path)
        event = verified_event(task, outcome, self.clock())
        if event.ok:
            _log.info("job %s step %d verified", task.job_id, task.step)
        else:
            _log.warning("job %s step %d is corrupt: %s", task.job_id, task.step, event.error)
        await self._append(event, verified_msg_id(task.job_id, task.step))

    async def delete(self, task: Delete) -> None:
        async with self._disk:
            left_because = keep_files_because(task, await asyncio.to_thread(_manifest_sha256, task))
            if not left_because:
                # Just before removing: only the owner of the job's partition removes its files.
                self._still_ours(task.job_id)
                await asyncio.to_thread(_remove_folder, task.path)
        if left_because:
            _log.error("job %s step %d: not removing %r: %s", task.job_id, task.step, task.path, left_because)
        else:
            _log.info("job %s step %d removed (%s)", task.job_id, task.step, task.reason)
        # Files first, then the event: a crash in between leaves a step the log still lists, which the
        # next pass deletes again (already gone is fine), never files the log says are gone.
        event = deleted_event(task, self.clock(), left_because=left_because)
        await self._append(event, deleted_msg_id(task.job_id, task.step))

    async def _append(self, event: CheckpointEvent, msg_id: str) -> None:
        """Append for the event's job, fenced by the epoch of its partition's ownership: ``NotOwner`` when
        this replica does not own it now; ``AppendConflict`` (and the partition dropped) when a newer one
        does."""
        subject = subjects.checkpoint(event.job_id)
        if self.partitions is None:
            seq = await self.log.append(subject, event, msg_id=msg_id, source=SOURCE)
        else:
            seq = await self.partitions.append(event.job_id, subject, event, msg_id)
        # The next plan must see this outcome, or it would ask for the same work again.
        await self.follower.wait_for(seq)


def _manifest_sha256(task: Delete) -> str | None:
    """Digest of the manifest in the step's folder now; None if there is none (or no such folder)."""
    if not is_step_folder(task.path, task.step):
        return None  # not read either: the path may be anything
    try:
        return sha256_file(Path(task.path) / MANIFEST)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _remove_folder(path: str) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        # Already gone (an earlier pass removed it and crashed before the event): done. Something that
        # vanished mid-walk while the folder stays is not done: raise, and the next pass tries again.
        if os.path.lexists(path):
            raise
