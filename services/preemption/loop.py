"""The preemption shell: while elected, ask the core which jobs must stop, and request it in the log.

It runs the same configured policy as the scheduler on the same fold, so both see the same decisions;
the scheduler appends the binds, this service only the ``PreemptionRequested`` part. Its writes are
fenced on their own tree (``rally.preempt.>``) so a stale preemption leader can never ask twice.
The job controller carries each request out (SIGTERM, checkpoint, grace, then ``JobPreempted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from rallypoint.eventlog import AppendConflict, EventLog, LogUnavailable
from rallypoint.events import subjects
from rallypoint.runtime import LeaderLease
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
        decisions = self.policy.decide(state, now)
        writes = preemption_writes(
            decisions, state, epoch=self.writer.epoch, policy_version=self.policy.version, at=now
        )
        for write in writes:
            _log.info("requesting preemption: %s", write.msg_id)
            await self.writer.append(write.subject, write.event, write.msg_id)
        return len(writes)

    async def lead(self, still_leader: Callable[[], bool], stop: asyncio.Event, *, term: int = 0) -> None:
        await self.writer.start_epoch(term)
        while not stop.is_set() and still_leader():
            await self.cycle()
            await self.follower.next_change(self.tick_s)


async def preempt_while_elected(loop: PreemptionLoop, lease: LeaderLease, stop: asyncio.Event) -> None:
    while not stop.is_set():
        term = await lease.campaign(stop)
        if term is None or stop.is_set():
            break
        try:
            await loop.lead(lambda: lease.is_leader, stop, term=term)
        except AppendConflict as conflict:
            _log.warning("fenced by a newer preemption leader (%s); stepping down", conflict)
        except (LogUnavailable, TimeoutError) as exc:
            _log.warning("lost the log while leading (%s); stepping down", exc)
        finally:
            with contextlib.suppress(Exception):
                await lease.resign()
