"""Single-writer subject trees: every write is conditional on the tree's last sequence.

A newly elected leader appends ``LeaderEpochStarted`` on the tree's epoch subject first. That moves the
tree's last sequence, so the next write of any older leader (which still expects the old sequence) is
refused by the server with 10071 and surfaces as ``AppendConflict``: safety comes from the log, not the
lease. The scheduler fences ``rally.sched.>``, where it writes every decision of a cycle.

``append_many`` writes a whole cycle's output as atomic batches (at most ``EventLog.max_batch`` events
each: ``MAX_BATCH``, or less where a server's limit is lower), every batch fenced on the tree's last
sequence after the one before: a deposed leader loses its whole batch, never a part of it, and the
writer does not wait for its fold between the writes of one cycle.
Events off the tree (the scheduler's admissions) may ride along; they are fenced the same way.

One writer's appends go one at a time (``_turn``). On one server concurrent appends that expect the same
tree sequence all pass (their subjects are off the tree, so none moves it), but a clustered stream's leader
refuses every proposal but one while another that expects the same sequence is in flight (10164), which
would read as a newer owner's fence and depose a partition's rightful owner (seen on a three-server
cluster: its partitions flapped between the job controllers, jobs waited). Their order is kept too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from rallypoint.eventlog import BatchTooLarge, Entry, EventLog, subject_matches
from rallypoint.events import Event, LeaderEpochStarted

from .follower import Follower

_log = logging.getLogger("rallypoint.fencing")


class FencedWriter:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        *,
        role: str,
        tree: str,
        epoch_subject: str,
        instance: str,
        source: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = log
        self.follower = follower
        self.role = role
        self.tree = tree
        self.epoch_subject = epoch_subject
        self.instance = instance
        self.source = source
        self.clock = clock
        self.epoch = 0
        self.fence = 0
        self._turn = asyncio.Lock()  # one fenced append in flight per writer (module docstring)

    async def start_epoch(self, term: int = 0) -> int:
        """Fence every earlier leader; AppendConflict if another contender got there first.

        The epoch is above both the log's last epoch for this role and the lease term, so epochs only
        grow even if the lease bucket was recreated."""
        # a fold of part of the log (the health monitor's) waits for the last event on its own subjects
        await self.follower.wait_for(
            await self.log.last_seq(self.follower.subjects if self.follower.partial else None)
        )
        self.fence = await self.log.last_seq(self.tree)
        epoch = max(self.follower.state.epochs.get(self.role, 0) + 1, term)
        event = LeaderEpochStarted(epoch=epoch, leader_id=self.instance, role=self.role, at=self.clock())
        # The id names the contender: two contenders for one epoch must not be deduplicated into a
        # single write that both believe they made.
        seq = await self.append(self.epoch_subject, event, f"{self.role}-epoch:{epoch}:{self.instance}")
        await self.follower.wait_for(seq)
        self.epoch = epoch
        _log.info("%s leading as epoch %d from seq %d", self.role, epoch, seq)
        return epoch

    async def append(self, subject: str, event: Event, msg_id: str) -> int:
        async with self._turn:
            seq = await self.log.append(
                subject,
                event,
                msg_id=msg_id,
                source=self.source,
                expected_last_subject_seq=self.fence,
                expected_subject_filter=self.tree,
            )
            if subject_matches(self.tree, subject):  # a write off the tree leaves the tree's last sequence
                self.fence = max(self.fence, seq)  # a duplicate answers with its first, older, sequence
            return seq

    async def append_many(self, writes: Sequence[Entry]) -> int:
        """Append ``writes`` in order, fenced, as few atomic batches; the last sequence written (0: none).

        ``AppendConflict`` (a newer leader) refuses a whole batch: the batches before it stay, as each
        single append before a refused one stays today."""
        async with self._turn:
            return await self._append_batches(writes)

    async def _append_batches(self, writes: Sequence[Entry]) -> int:
        last = 0
        start = 0
        while start < len(writes):
            batch = writes[start : start + self.log.max_batch]
            try:
                result = await self.log.append_batch(
                    batch,
                    source=self.source,
                    expected_last_subject_seq=self.fence,
                    expected_subject_filter=self.tree,
                )
            except BatchTooLarge:
                continue  # nothing stored, and the log now keeps to the server's limit: split again
            self.fence = self._fence_after(batch, result.first_seq)
            last = result.last_seq
            start += len(batch)
        return last

    def _fence_after(self, batch: Sequence[Entry], first_seq: int) -> int:
        """The tree's last sequence once ``batch`` is stored at first_seq..: its last event on the tree."""
        for i in range(len(batch) - 1, -1, -1):
            if subject_matches(self.tree, batch[i].subject):
                return first_seq + i
        return self.fence
