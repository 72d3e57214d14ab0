"""A fold of part of the log (the health monitor's ``rally.node.>``) holds what those subjects say, no
more: its replay and its live follow skip every other event, its waits end on its own subjects' events,
and its position is compared with the last event stored on those subjects, not the stream's."""

from __future__ import annotations

import asyncio
import contextlib

from rallypoint.eventlog import EventLog
from rallypoint.events import Event, LeaderEpochStarted, NodeLost, subjects
from rallypoint.events.synthetic import job_life, node_name, registered_node
from rallypoint.runtime.follower import Follower

N1, N2 = node_name(1), node_name(2)


def _life(job_id: str) -> list[Event]:
    """A job on node 1 from its submission to its bind (submitted, queued, bound)."""
    phases = job_life(job_id, node_id=N1, gpus=(0,), ranks=1, at=1.0, run_s=1.0)
    return [event for phase in phases[:3] for event in phase]


async def _append(log: EventLog, *events: Event) -> int:
    seq = 0
    for event in events:
        msg_id = f"{type(event).__name__}-{getattr(event, 'job_id', '')}-{getattr(event, 'node_id', '')}"
        seq = await log.append(subjects.for_event(event), event, msg_id=msg_id, source="t")
    return seq


async def test_the_nodes_fold_replays_and_follows_the_nodes_events_alone(event_log: EventLog) -> None:
    await _append(event_log, LeaderEpochStarted(epoch=1, leader_id="t", at=0.0), registered_node(1, at=0.5))
    last_node = await _append(event_log, registered_node(2, at=0.5))
    await _append(event_log, *_life("j1"))
    nodes = Follower(event_log, subjects=subjects.NODES)
    whole = Follower(event_log)
    await nodes.catch_up()
    await whole.catch_up()
    assert nodes.partial and not whole.partial
    assert set(nodes.state.nodes) == {N1, N2} and nodes.state.jobs == {}
    assert whole.state.jobs["j1"].state == "bound"
    assert nodes.state.last_seq == last_node < whole.state.last_seq
    assert nodes.state.nodes[N1].allocated == {} != whole.state.nodes[N1].allocated

    follow = asyncio.create_task(nodes.run())
    try:
        await _append(event_log, *_life("j2")[:1])
        lost = await _append(event_log, NodeLost(node_id=N1, reason="silent", at=3.0))
        await _append(event_log, *_life("j3")[:1])
        await nodes.wait_for(lost, timeout=5.0)
        await nodes.probe_stream()
        assert nodes.state.nodes[N1].status == "lost" and nodes.state.jobs == {}
        # caught up with its subjects while the stream holds a later job event: no lag to report
        assert nodes.position() == (lost, lost) and await event_log.last_seq() == lost + 1
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
