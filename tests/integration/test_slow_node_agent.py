"""A simulated straggler is a real one: the agent process, told by its fault file that its node is 3x slow,
duty-cycles its rank, and the step times the rank itself reports (through the training client's
``Reporter``) grow; the heartbeats carry the simulated NICs and the new GPU signals.

Real NATS, the real agent process (``python -m rallypoint_services.agent``), a real rank process.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from test_agent import NODE, Agent, agent_env, first_heartbeat, launch, task

from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.protocol import Heartbeat, NicSample

__all__ = ["agent_env"]  # the fixture, imported so pytest finds it here

# Fixed CPU work per step; reports the mean wall time per step over each (rate-limited) report, so a
# step that straddles a stop phase and one that does not average out.
STEPPING_RANK = r"""
import os, time
from rallypoint.ckpt.report import Reporter
reporter = Reporter(os.environ["RALLY_REPORT_FILE"], job_id=os.environ["RALLY_JOB_ID"],
                    attempt=int(os.environ["RALLY_ATTEMPT"]), rank=int(os.environ["RANK"]))
step, since, steps_since = 0, time.monotonic(), 0
while True:
    time.sleep(0.01)  # a step that waits, not one that computes: other load on the host leaves it alone
    step += 1
    steps_since += 1
    now = time.monotonic()
    if now - since >= 1.0 and reporter.step(step, (now - since) / steps_since):
        since, steps_since = now, 0
"""

SETTLE_S = 1.5


async def step_times(
    log: EventLog, count: int, after: float, timeout: float = 30.0
) -> tuple[list[float], Heartbeat]:
    """``count`` distinct step-time reports made after ``after`` (wall clock), and the last heartbeat."""
    sub = await log.nc.subscribe(subjects.heartbeat(NODE))
    seen: dict[float, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(seen)} reports after {after}"
            beat = msgspec.json.decode((await sub.next_msg(timeout=remaining)).data, type=Heartbeat)
            for r in beat.ranks:
                if r.progress_at is not None and r.step_time_s is not None and r.progress_at > after:
                    seen[r.progress_at] = r.step_time_s
            if len(seen) >= count:
                return [seen[at] for at in sorted(seen)][:count], beat
    finally:
        await sub.unsubscribe()


async def test_a_slow_simulated_node_really_slows_its_rank(
    event_log: EventLog, agent_env: Callable[..., Agent], tmp_path: Path
) -> None:
    faults = tmp_path / "faults"
    faults.write_text("")
    agent_env("--fault-file", str(faults))
    first = await first_heartbeat(event_log)  # up: its command subscriptions come before its heartbeats
    assert first.nics == (NicSample(name="ib0", link_up=True, speed_gbps=400.0, errors=0),)
    reply = await launch(event_log, task("straggle", [sys.executable, "-c", STEPPING_RANK], ranks=1))
    assert reply.ok, reply.error

    normal, beat = await step_times(event_log, 3, after=0.0)
    assert all(g.ecc_corrected == 0 and not g.throttled for g in beat.gpus)

    faults.write_text("node:slow=3\nib0:speed=200\n0:ecc_corrected=5\n")
    # The next heartbeat (0.2 s) reads the file; a report averages the second before it: skip those.
    slow, beat = await step_times(event_log, 3, after=time.time() + SETTLE_S)
    assert beat.nics[0].speed_gbps == 200.0
    assert beat.gpus[0].ecc_corrected > 0 and beat.gpus[1].ecc_corrected == 0
    # Stopped 2/3 of each 50 ms period: a 10 ms step that ends in a stopped phase waits for its end,
    # 2.5x in theory; 1.67x measured on a host loaded by a whole test run (the agent that stops and
    # continues the rank is late too), where the normal steps slow as well. Unslowed is 1.0x.
    assert statistics.median(slow) > 1.4 * statistics.median(normal), (normal, slow)

    faults.write_text("")
    back, _ = await step_times(event_log, 3, after=time.time() + SETTLE_S)
    assert statistics.median(back) < 0.6 * statistics.median(slow), (normal, slow, back)
