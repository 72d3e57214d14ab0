"""The scheduler shell: follow the log, win the lease, fence older leaders, append the core's decisions.

No decision is made here: ``rallypoint.scheduling`` turns the folded state into a snapshot, the pure core
decides, and this loop only appends what it returns. Safety does not rest on the lease: every write
is conditional on the last sequence of the ``rally.sched.>`` tree, and a new leader bumps that tree
with ``LeaderEpochStarted`` first, so a paused or partitioned old leader's next write is refused by the
server (``AppendConflict``) and it steps down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy, admission_writes, decision_writes
from rallypoint.scheduling.repair import REPAIR_WAIT_S, repair_writes
from rallypoint.state import ClusterState

_log = logging.getLogger("rallypoint.scheduler")

SOURCE = "rallypoint/scheduler"


class SchedulerLoop:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        *,
        instance: str,
        policy: SchedulingPolicy,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
        repair_wait_s: float = REPAIR_WAIT_S,
    ) -> None:
        self.log = log
        self.follower = follower
        self.instance = instance
        self.policy = policy
        self.clock = clock
        self.tick_s = tick_s
        self.repair_wait_s = repair_wait_s
        self.writer = FencedWriter(
            log,
            follower,
            role="scheduler",
            tree=subjects.SCHEDULER_TREE,
            epoch_subject=subjects.EPOCH,
            instance=instance,
            source=SOURCE,
            clock=clock,
        )
        self.cycles = 0

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def epoch(self) -> int:
        return self.writer.epoch

    async def start_epoch(self, term: int = 0) -> int:
        return await self.writer.start_epoch(term)

    async def cycle(self) -> int:
        """One scheduling cycle; returns the number of appends it made."""
        await self.follower.wait_for(self.writer.fence)
        state = self.state
        now = self.clock()
        writes = await self._repair(state, now)
        admissions = admission_writes(state, at=now)
        # Independent appends on distinct subjects: send them together rather than one round trip each.
        await asyncio.gather(
            *(self.log.append(w.subject, w.event, msg_id=w.msg_id, source=SOURCE) for w in admissions)
        )
        writes += len(admissions)
        if writes:
            await self.follower.wait_for(await self.log.last_seq())
        if not state.pending_jobs():
            return writes
        decisions = self.policy.decide_live(state, now)
        for write in decision_writes(
            decisions, state, epoch=self.epoch, policy_version=self.policy.version, at=now
        ):
            await self.writer.append(write.subject, write.event, write.msg_id)
            writes += 1
        self.cycles += 1
        return writes

    async def _repair(self, state: ClusterState, now: float) -> int:
        """Interrupted gangs first: they hold GPUs already, and their replacement must not go to new work."""
        if not state.repairing_jobs():
            return 0
        model = self.policy.model_sync.sync(state)
        repairs = repair_writes(
            state,
            model,
            now,
            epoch=self.epoch,
            policy_version=self.policy.version,
            at=now,
            repair_wait_s=self.repair_wait_s,
        )
        for write in repairs:
            await self.writer.append(write.subject, write.event, write.msg_id)
        if repairs:
            await self.follower.wait_for(self.writer.fence)
        return len(repairs)
