"""What the accounting routes read: every attempt (a ledger kept beside the API's fold) and one job's events.

The API's fold keeps only each job's current attempt. ``LedgerCache`` folds the log a second time with the
``AttemptLedger``, lazily: each request first replays what was appended since the last one, so a quiet
API costs nothing and a busy one replays only the tail. ``job_events`` reads one job's events by subject
filter (plus the node and leader-epoch events its fold needs to accept the decisions, and its binds among the
cycles' ``GangsBound`` since its first event), merged in log order.
"""

from __future__ import annotations

import asyncio

from rallypoint.accounting.attempts import AttemptLedger
from rallypoint.eventlog import EventLog
from rallypoint.events import Event, GangsBound
from rallypoint.events.codec import Quarantined
from rallypoint.events.subjects import BINDS, EPOCH_SUBJECTS, NODES
from rallypoint.state import ClusterState

Stored = tuple[int, Event | Quarantined]


def job_subjects(job_id: str) -> tuple[str, ...]:
    """Every subject a job's events are stored on (``events.subjects``), old preemption tree included."""
    return (
        f"rally.job.{job_id}",
        f"rally.queue.{job_id}",
        f"rally.ctl.job.{job_id}",
        f"rally.sched.*.{job_id}",
        f"rally.preempt.request.{job_id}",
        f"rally.agent.*.job.{job_id}",
        f"rally.agent.*.ckpt.{job_id}",
        f"rally.ckpt.{job_id}",
    )


async def _read(log: EventLog, subjects: str, to_seq: int) -> list[Stored]:
    return [
        (item.seq, _event(item))
        async for item in log.replay(subjects=subjects, to_seq=to_seq, quarantine=True)
    ]


def _event(item: object) -> Event | Quarantined:
    return item if isinstance(item, Quarantined) else item.event  # type: ignore[attr-defined]


async def job_events(log: EventLog, job_id: str) -> list[Stored]:
    """The job's events with the node and epoch events, in log order, up to the log's end now; its binds
    written with others' in one ``GangsBound`` each as the ``GangBound`` it holds for the job."""
    last = await log.last_seq()
    own_filters = job_subjects(job_id)
    filters = (*own_filters, NODES, *EPOCH_SUBJECTS.values())
    parts = await asyncio.gather(*(_read(log, f, last) for f in filters))
    merged = {seq: event for part in parts for seq, event in part}
    first = min((seq for part in parts[: len(own_filters)] for seq, _ in part), default=None)
    if first is not None:  # nothing of the job's is stored before its first event of its own
        merged.update(await _binds_among_others(log, job_id, first, last))
    return sorted(merged.items())


async def _binds_among_others(log: EventLog, job_id: str, from_seq: int, to_seq: int) -> list[Stored]:
    """``job_id``'s binds in the cycles' ``GangsBound`` messages from ``from_seq`` on (``rally.sched.binds``
    holds every job's, so it is read from the job's first event only)."""
    found: list[Stored] = []
    async for item in log.replay(subjects=BINDS, from_seq=from_seq, to_seq=to_seq, quarantine=True):
        event = _event(item)
        if isinstance(event, GangsBound):
            found.extend((item.seq, bind) for bind in event.binds if bind.job_id == job_id)
    return found


class LedgerCache:
    """A fold plus the attempt ledger, brought up to the log's end on demand (one refresh at a time)."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.state = ClusterState()
        self.ledger = AttemptLedger()
        self._lock = asyncio.Lock()

    async def current(self) -> tuple[ClusterState, AttemptLedger]:
        async with self._lock:
            last = await self.log.last_seq()
            if last > self.state.last_seq:
                replay = self.log.replay(from_seq=self.state.last_seq + 1, to_seq=last, quarantine=True)
                async for item in replay:
                    self.ledger.apply_stored(self.state, item.seq, _event(item))
        return self.state, self.ledger
