"""The preemption shell: while elected, ask the core which jobs must stop, and request it in the log.

It runs the same configured policy as the scheduler on the same fold, so both see the same decisions;
the scheduler appends the binds, this service only the ``PreemptionRequested`` part. Its writes are
fenced on their own tree (``rally.preempt.>``) so a stale preemption leader can never ask twice.
The job controller carries each request out (SIGTERM, checkpoint, grace, then ``JobPreempted``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.runtime.fencing import FencedWriter
from rallypoint.runtime.follower import Follower
from rallypoint.scheduling import SchedulingPolicy, preemption_writes

_log = logging.getLogger("rallypoint.preemption")
SOURCE = "rallypoint/preemption"


class PreemptionLoop:
    def __init__(
        self,
        log: EventLog,
        follower: Follower,
        *,
        instance: str,
        policy: SchedulingPolicy,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
    ) -> None:
        self.follower = follower
        self.policy = policy
        self.clock = clock
        self.tick_s = tick_s
        self.writer = FencedWriter(
            log,
            follower,
            role="preemption",
            tree=subjects.PREEMPTION_TREE,
            epoch_subject=subjects.PREEMPTION_EPOCH,
            instance=instance,
            source=SOURCE,
            clock=clock,
        )

    async def cycle(self) -> int:
        await self.follower.wait_for(self.writer.fence)
        state = self.follower.state
        if not state.pending_jobs():
            return 0
        now = self.clock()
        decisions = self.policy.decide_live(state, now)
        writes = preemption_writes(
            decisions, state, epoch=self.writer.epoch, policy_version=self.policy.version, at=now
        )
        for write in writes:
            _log.info("requesting preemption: %s", write.msg_id)
            await self.writer.append(write.subject, write.event, write.msg_id)
        return len(writes)
