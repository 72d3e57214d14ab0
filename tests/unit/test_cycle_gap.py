"""The leader's loop under a stream of changes: cycles start at least ``min_cycle_gap_s`` apart, so what
arrives meanwhile is decided together; without a gap, every change may start one.

The loop here is the smallest ``FencedLoop``: it records when each cycle starts (no log, no decisions:
what ``leadership.lead`` does between cycles is all that is under test).
"""

from __future__ import annotations

import asyncio
import time

from rallypoint.runtime.leadership import lead


class _Lease:
    is_leader = True


class _Writer:
    async def start_epoch(self, term: int) -> int:
        return term


class _Follower:
    def __init__(self) -> None:
        self.changed = asyncio.Event()


class _RecordingLoop:
    def __init__(self, gap_s: float) -> None:
        self.writer = _Writer()
        self.follower = _Follower()
        self.tick_s = 60.0  # no idle tick in these tests: only changes start cycles
        self.min_cycle_gap_s = gap_s
        self.starts: list[float] = []

    async def cycle(self) -> int:
        self.starts.append(time.monotonic())
        return 0

    def idle(self) -> None:
        pass


async def _stream_of_changes(gap_s: float, changes: int = 150, every_s: float = 0.002) -> list[float]:
    """Cycle starts while a change comes every ``every_s``; the gaps between them."""
    loop = _RecordingLoop(gap_s)
    stop = asyncio.Event()
    task = asyncio.create_task(lead(loop, _Lease(), stop, term=1))  # type: ignore[arg-type]
    for _ in range(changes):
        loop.follower.changed.set()
        await asyncio.sleep(every_s)
    stop.set()
    loop.follower.changed.set()
    await asyncio.wait_for(task, 10)
    assert len(loop.starts) >= 2, "the stream started no second cycle"
    return [later - earlier for earlier, later in zip(loop.starts, loop.starts[1:], strict=False)]


async def test_under_a_stream_of_changes_cycles_start_at_least_the_gap_apart() -> None:
    gaps = await _stream_of_changes(0.05)
    assert min(gaps) >= 0.05 - 0.001, f"cycles {min(gaps) * 1000:.1f} ms apart"


async def test_without_a_gap_a_change_starts_the_next_cycle_at_once() -> None:
    gaps = await _stream_of_changes(0.0)
    assert min(gaps) < 0.05, f"cycles at least {min(gaps) * 1000:.1f} ms apart with no gap asked for"
