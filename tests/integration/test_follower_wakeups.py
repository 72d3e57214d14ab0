"""A ``wait_for(seq)`` that starts during the initial replay ends when the replay applies ``seq``.

Before the fix only the live follow woke waiters, so such a wait hung until its timeout although the
replay had long applied its sequence (a service appending during its own start-up stalled for 10 s).
"""

from __future__ import annotations

import asyncio
import time

from rallypoint.eventlog import EventLog
from rallypoint.events import JobQueued, subjects
from rallypoint.runtime.follower import Follower


async def _fill(log: EventLog, count: int) -> int:
    appends = (
        log.append(
            subjects.admission(f"j{i}"),
            JobQueued(job_id=f"j{i}", queue="q", at=1.0),
            msg_id=f"j{i}",
            source="t",
        )
        for i in range(count)
    )
    return max(await asyncio.gather(*appends))


async def test_a_wait_for_started_during_the_replay_ends_when_the_replay_applies_its_seq(
    event_log: EventLog,
) -> None:
    last = await _fill(event_log, 2000)
    follower = Follower(event_log)
    started = time.monotonic()
    waits = [asyncio.create_task(follower.wait_for(seq, timeout=20.0)) for seq in (1, last // 2, last)]
    await asyncio.sleep(0)  # the waiters are waiting before the replay starts
    await follower.catch_up()
    await asyncio.wait_for(asyncio.gather(*waits), 5.0)
    assert follower.state.last_seq == last
    assert time.monotonic() - started < 5.0


async def test_next_change_wakes_on_the_replay_too(event_log: EventLog) -> None:
    await _fill(event_log, 10)
    follower = Follower(event_log)
    change = asyncio.create_task(follower.next_change(timeout=20.0))
    await asyncio.sleep(0)
    await follower.catch_up()
    assert await asyncio.wait_for(change, 5.0) is True
