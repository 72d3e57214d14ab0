"""Pure part of the projector: turn the shared fold into table rows, batch by batch.

Nothing here does I/O. ``ReadModel`` wraps the one ``ClusterState`` fold (it never re-implements a
rule of it) and remembers which rows each event may have changed, so a batch writes only those rows.
The rows themselves are functions of the fold's ``JobView`` / ``NodeView``, so a row written
incrementally and a row written by a rebuild from zero are equal by construction.

An event PostgreSQL refuses to store (``RefusedEvent``: a NUL in a string, a number out of a column's
range) still moves the fold, like every other fold of the log; only its rows are missing, and the
next event that touches the same job or node writes their rows from the fold again.

The one thing the fold does not keep is when a node row last changed (``NodeView`` has no sequence;
a bind or release changes ``gpus_free`` through a job event), so ``ReadModel`` keeps that map beside
the fold and saves it in the same snapshot.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from rallypoint.accounting.attempts import AttemptLedger, AttemptRecord
from rallypoint.events import Event, GangsBound, event_type
from rallypoint.events.codec import MAX_QUARANTINE_TEXT, Quarantined
from rallypoint.state import ACTIVE, ClusterState, JobView, NodeView

JobRow = tuple[Any, ...]
NodeRow = tuple[Any, ...]
EventRow = tuple[Any, ...]
AttemptRow = tuple[Any, ...]
QuarantineRow = tuple[Any, ...]

_json = msgspec.json.Encoder()


class RecordedLike(Protocol):
    """What the projector needs of an ``eventlog.Recorded``; keeps this module free of NATS."""

    @property
    def seq(self) -> int: ...
    @property
    def subject(self) -> str: ...
    @property
    def event(self) -> Event: ...
    @property
    def envelope(self) -> Mapping[str, str]: ...


def timestamp(seconds: float | None) -> dt.datetime | None:
    """Event times are float epoch seconds; PostgreSQL keeps microseconds, so round there once."""
    if seconds is None:
        return None
    return _utc(seconds)


# A job's row is built again in every batch that touches it (about five times in a short job's life),
# each time with the same few times: converted once, looked up after (datetimes are immutable).
@functools.lru_cache(maxsize=16_384)
def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(round(seconds, 6), tz=dt.UTC)


def job_row(job: JobView) -> JobRow:
    """One ``jobs`` row, in ``schema.JOB_COLUMNS`` order."""
    spec = job.spec
    # dict.fromkeys keeps first-seen order: the node list reads in task order, each node once.
    nodes = list(dict.fromkeys(p.node_id for p in job.placements))
    placements = [{"task": p.task, "node_id": p.node_id, "gpus": list(p.gpus)} for p in job.placements]
    return (
        job.job_id,
        spec.name,
        spec.team,
        spec.priority,
        job.state,
        spec.gpus,
        spec.gpus_per_task,
        job.attempt,
        job.queue,
        job.cancel_requested,
        timestamp(job.submitted_at),
        timestamp(job.bound_at),
        timestamp(job.started_at),
        timestamp(job.ended_at),
        job.exit_code,
        job.reason,
        job.pending_code,
        job.pending_message,
        nodes,
        placements,
        job.preemptions,
        timestamp(job.last_preempted_at),
        job.preempt_for,
        job.last_seq,
    )


def node_row(node: NodeView, last_seq: int) -> NodeRow:
    """One ``nodes`` row, in ``schema.NODE_COLUMNS`` order."""
    return (
        node.node_id,
        node.address,
        node.rack,
        node.spine,
        node.gpu_type,
        node.gpu_count,
        node.gpu_count - len(node.allocated),
        node.status,
        node.status_reason,
        node.health,
        last_seq,
    )


def attempt_row(rec: AttemptRecord) -> AttemptRow:
    """One ``attempts`` row, in ``schema.ATTEMPT_COLUMNS`` order."""
    placements = [{"task": p.task, "node_id": p.node_id, "gpus": list(p.gpus)} for p in rec.placements]
    return (
        rec.job_id,
        rec.attempt,
        rec.team,
        rec.user,
        rec.priority,
        rec.gpus,
        rec.nodes,
        placements,
        timestamp(rec.bound_at),
        timestamp(rec.started_at),
        timestamp(rec.ended_at),
        rec.started_at,
        rec.ended_at,
        rec.outcome,
        rec.reason,
        rec.exit_code,
        rec.preempted_for,
        rec.lost_gpu_s,
        rec.resume_step,
        rec.last_seq,
        rec.failed_rank,
        rec.gpu_milli,
    )


def event_time(rec: RecordedLike) -> dt.datetime | None:
    """The CloudEvents ``time`` of the envelope, else the event's own timestamp."""
    raw = rec.envelope.get("time")
    if raw:
        try:
            return dt.datetime.fromisoformat(raw)
        except ValueError:
            pass  # a malformed header must not stop the archive; fall back to the payload's time
    at = getattr(rec.event, "at", None)
    if at is None:
        at = getattr(rec.event, "submitted_at", None)
    return timestamp(at) if isinstance(at, int | float) else None


def event_row(rec: RecordedLike) -> EventRow:
    """One ``events`` archive row, in ``schema.EVENT_COLUMNS`` order; its ``data`` and ``envelope`` are
    JSON already encoded (``msgspec.Raw``), which the writer embeds as they are."""
    return (
        rec.seq,
        rec.subject,
        event_type(rec.event),
        event_time(rec),
        msgspec.Raw(_json.encode(rec.event)),
        msgspec.Raw(_json.encode(dict(rec.envelope))),
    )


def quarantine_row(item: Quarantined) -> EventRow:
    """The archive row of a message no fold can read: its place in the log and why it was skipped."""
    return _skipped_row(item.seq, item.subject, item.event_type, item.reason, item.error)


def _skipped_row(seq: int, subject: str, tag: str, reason: str, error: str) -> EventRow:
    # Every string made storable: an error may quote the value that could not be read, NUL and all.
    data = {
        "seq": seq,
        "subject": storable_text(subject),
        "event_type": storable_text(tag),
        "reason": reason,
        "error": storable_text(error),
    }
    envelope = msgspec.Raw(b"{}")
    return (seq, storable_text(subject), "quarantined", None, msgspec.Raw(_json.encode(data)), envelope)


def storable_text(text: str, limit: int | None = None) -> str:
    """``text`` (cut to ``limit`` characters) with every NUL written out as ``\\u0000``: PostgreSQL's
    text and jsonb hold any character but NUL. For what the projector says about an event, never for
    the event itself (that is stored as it is, or quarantined)."""
    return (text if limit is None else text[:limit]).replace("\x00", "\\u0000")


class RefusedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event PostgreSQL refused to store, where it is in the log and why (texts made storable)."""

    seq: int
    subject: str
    event_type: str
    error: str

    @classmethod
    def of(cls, item: RecordedLike | Quarantined, error: str) -> RefusedEvent:
        tag = item.event_type if isinstance(item, Quarantined) else event_type(item.event)
        return cls(
            seq=item.seq,
            subject=storable_text(item.subject),
            event_type=storable_text(tag, MAX_QUARANTINE_TEXT),
            error=storable_text(error, 4 * MAX_QUARANTINE_TEXT),
        )

    def describe(self) -> str:
        return f"seq {self.seq} on {self.subject}: {self.event_type} refused by PostgreSQL: {self.error}"


def refusal_batch(item: RecordedLike | Quarantined, refused: RefusedEvent) -> Batch:
    """What replaces the rows of a refused event: its quarantine row and an archive row saying so, at
    its sequence (so the archive still holds every sequence once), and no view row."""
    data = _json.encode(item if isinstance(item, Quarantined) else item.event)
    return Batch(
        first_seq=item.seq,
        last_seq=item.seq,
        events=[_skipped_row(item.seq, refused.subject, refused.event_type, "refused", refused.error)],
        jobs=[],
        nodes=[],
        quarantined=[(refused.seq, refused.subject, refused.event_type, refused.error, data)],
    )


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one transaction writes: the archive rows, the changed view rows, the new position."""

    first_seq: int
    last_seq: int
    events: list[EventRow]
    jobs: list[JobRow]
    nodes: list[NodeRow]
    attempts: list[AttemptRow] = []
    quarantined: list[QuarantineRow] = []  # events refused by PostgreSQL, in ``QUARANTINE_COLUMNS`` order


class _Snapshot(msgspec.Struct, kw_only=True):
    state: ClusterState
    node_seq: dict[str, int]
    # Required: a snapshot from before the ledger existed fails to decode and the fold restarts from zero,
    # instead of going on with no attempts.
    attempts: AttemptLedger


class ReadModel:
    """The shared fold plus what a projection needs to write only the rows a batch changed."""

    def __init__(
        self,
        state: ClusterState | None = None,
        node_seq: dict[str, int] | None = None,
        attempts: AttemptLedger | None = None,
    ) -> None:
        self.state = state if state is not None else ClusterState()
        # node id -> sequence of the last event that changed the node's row.
        self.node_seq: dict[str, int] = node_seq if node_seq is not None else {}
        # Every attempt of every job; it drives the fold for job events (``AttemptLedger.apply``).
        self.attempts = attempts if attempts is not None else AttemptLedger()
        # (job id, attempt) of the attempt rows changed since the last ``fold`` batch
        self._attempts_touched: set[tuple[str, int]] = set()

    @property
    def position(self) -> int:
        return self.state.last_seq

    # -- folding ---------------------------------------------------------------------------

    def apply(self, seq: int, event: Event) -> tuple[set[str], set[str]]:
        """Fold one event; return the (job ids, node ids) whose rows it changed."""
        if isinstance(event, GangsBound):
            return self._apply_binds(seq, event)
        job_id: str | None = getattr(event, "job_id", None)
        if job_id is not None:
            return self._apply_job_event(seq, event, job_id)
        node_id: str | None = getattr(event, "node_id", None)
        if node_id is not None:
            return self._apply_node_event(seq, event, node_id)
        self.state.apply(seq, event)  # scheduler epochs: no row of ours shows them
        return set(), set()

    def _apply_binds(self, seq: int, event: GangsBound) -> tuple[set[str], set[str]]:
        """A cycle's binds, each as if stored alone at ``seq`` (the event keeps its one archive row)."""
        jobs: set[str] = set()
        nodes: set[str] = set()
        for bind in event.binds:
            changed_jobs, changed_nodes = self._apply_job_event(seq, bind, bind.job_id)
            jobs |= changed_jobs
            nodes |= changed_nodes
        return jobs, nodes

    def _apply_job_event(self, seq: int, event: Event, job_id: str) -> tuple[set[str], set[str]]:
        # The fold holds a job's GPUs exactly while it is bound or running, on its placements: so node
        # rows change only when the job enters or leaves that set, or its placements change. Checking
        # that costs two lookups; diffing every node of every gang on every RankExited would not.
        state = self.state
        job = state.jobs.get(job_id)
        was_active = job is not None and job.state in ACTIVE
        old_placements = job.placements if job is not None else ()
        for rec in self.attempts.apply(state, seq, event):
            self._attempts_touched.add((rec.job_id, rec.attempt))
        job = state.jobs.get(job_id)
        if job is None:
            return set(), set()  # an orphan: the fold counted it, no row shows it
        nodes: set[str] = set()
        if (job.state in ACTIVE) != was_active or job.placements is not old_placements:
            # membership test per node: ``intersection_update(state.nodes)`` walks every node of the
            # cluster (12,500 lookups per bind at full size: a quarter of the projector's CPU)
            known = state.nodes
            nodes = {p.node_id for p in (*old_placements, *job.placements) if p.node_id in known}
            for n in nodes:
                self.node_seq[n] = seq
        # The job's row always changes: at least its last_seq moved with the fold.
        return {job_id}, nodes

    def _apply_node_event(self, seq: int, event: Event, node_id: str) -> tuple[set[str], set[str]]:
        # Node events are rare (registrations, drains, losses), so diff the rows they could touch:
        # the node's own and, should the fold ever act on a node's gangs, those of the jobs on it.
        before_node = self._node_key(node_id)
        on_node = self._node_jobs(node_id)
        before_jobs = {j: self._job_key(j) for j in on_node}
        self.state.apply(seq, event)
        nodes: set[str] = set()
        if self._node_key(node_id) != before_node:
            self.node_seq[node_id] = seq
            nodes.add(node_id)
        jobs = {j for j, key in before_jobs.items() if self._job_key(j) != key}
        return jobs, nodes

    def apply_stored(self, item: RecordedLike | Quarantined) -> tuple[set[str], set[str]]:
        """Fold what the log holds at one sequence: an event, or a message no fold can read (skipped
        as every fold skips it, kept in the fold's quarantine log)."""
        if isinstance(item, Quarantined):
            self.state.apply_stored(item.seq, item)
            return set(), set()
        return self.apply(item.seq, item.event)

    def fold(self, records: Iterable[RecordedLike | Quarantined]) -> Batch | None:
        """Apply a batch; records at or below the current position are skipped (redeliveries)."""
        touched_jobs: set[str] = set()
        touched_nodes: set[str] = set()
        events: list[EventRow] = []
        self._attempts_touched.clear()
        first = 0
        for rec in records:
            if rec.seq <= self.position:
                continue
            first = first or rec.seq
            jobs, nodes = self.apply_stored(rec)
            touched_jobs |= jobs
            touched_nodes |= nodes
            events.append(quarantine_row(rec) if isinstance(rec, Quarantined) else event_row(rec))
        if not events:
            return None
        return Batch(
            first_seq=first,
            last_seq=self.position,
            events=events,
            # Sorted keys: rows are locked in a fixed order, so two writers can never deadlock.
            jobs=[job_row(self.state.jobs[j]) for j in sorted(touched_jobs)],
            nodes=[self.node_row(n) for n in sorted(touched_nodes) if n in self.state.nodes],
            attempts=self._attempt_rows(sorted(self._attempts_touched)),
        )

    # -- rows ------------------------------------------------------------------------------

    def node_row(self, node_id: str) -> NodeRow:
        return node_row(self.state.nodes[node_id], self.node_seq.get(node_id, 0))

    def all_job_rows(self) -> list[JobRow]:
        return [job_row(self.state.jobs[j]) for j in sorted(self.state.jobs)]

    def all_node_rows(self) -> list[NodeRow]:
        return [self.node_row(n) for n in sorted(self.state.nodes)]

    def all_attempt_rows(self) -> list[AttemptRow]:
        return [attempt_row(rec) for rec in self.attempts.records()]

    def _attempt_rows(self, keys: list[tuple[str, int]]) -> list[AttemptRow]:
        rows = []
        for job_id, attempt in keys:
            rec = self.attempts.attempt(job_id, attempt)
            if rec is not None:
                rows.append(attempt_row(rec))
        return rows

    # -- snapshots -------------------------------------------------------------------------

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(
            _Snapshot(state=self.state, node_seq=self.node_seq, attempts=self.attempts)
        )

    @classmethod
    def decode(cls, data: bytes) -> ReadModel:
        snap = msgspec.msgpack.decode(data, type=_Snapshot)
        return cls(snap.state, snap.node_seq, snap.attempts)

    # -- helpers ---------------------------------------------------------------------------

    def _node_jobs(self, node_id: str) -> set[str]:
        node = self.state.nodes.get(node_id)
        return node.job_ids() if node is not None else set()

    def _node_key(self, node_id: str) -> NodeRow | None:
        node = self.state.nodes.get(node_id)
        return node_row(node, 0) if node is not None else None

    def _job_key(self, job_id: str) -> JobRow | None:
        job = self.state.jobs.get(job_id)
        return job_row(job) if job is not None else None
