"""ClusterState: the one fold over the log that every service, `rally replay` and the tests share.

It is pure: ``apply(seq, event)`` mutates only this object and reads nothing but its arguments, so the
same log always folds into the same state, and ``hash()`` proves it. Mutation (rather than returning
new copies) keeps a fold over millions of events cheap; the struct encodes to bytes for snapshots.

Rules that make concurrent writers safe to fold:
- only the current epoch's decisions count: a scheduler decision (``GangBound``, ``GangRepaired``,
  ``JobRequeued``, ``JobPending``, ``PreemptionRequested``) applies only when its ``epoch`` is the scheduler's
  current epoch in the fold (a ``PreemptionRequested`` of ``role`` "preemption", written by the preemption
  service before the scheduler wrote every decision, only with that role's, see ``decision_role``); any other
  (a stale leader's, or a forgery: epoch 0 before any leader) is counted in ``stale_decisions`` and changes
  nothing;
- a ``GangBound`` is applied only when the job is still pending, every GPU it names is free and the gang
  keeps the job's spec (its GPU type, tasks of ``gpus_per_task`` GPUs, the size or the elastic range);
  otherwise it is recorded in ``ignored_binds`` and changes nothing (a stale decision can never double-book
  a GPU); ``decision_refusal`` says why, the same way for the fold and the audit;
- terminal states are final: later events for a finished job change nothing;
- events for unknown jobs or nodes are counted in ``orphans`` rather than raising, because a partial
  replay (``--to SEQ``) or a log written by a newer version must still fold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import msgspec

from rallypoint.events import (
    CheckpointCommitted,
    CheckpointDeleted,
    CheckpointVerified,
    Event,
    GangBound,
    GangRepaired,
    GangResized,
    GangsBound,
    GpuInfo,
    HealthEvidence,
    JobAttemptFailed,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobInterrupted,
    JobPending,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobRequeued,
    JobResized,
    JobResumed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSuspended,
    JobSuspendRequested,
    LeaderEpochStarted,
    MigSlice,
    NodeDrained,
    NodeHealthChanged,
    NodeHeartbeatLost,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeRulesSet,
    NodeUndrained,
    PreemptionRequested,
    RankExited,
    TaskPlacement,
)
from rallypoint.events.catalogue import GPU_MILLI, quota_milli, share_milli
from rallypoint.events.codec import Quarantined, QuarantineLog
from rallypoint.userusage import UserLedger, end_attempt, start_attempt

from .dependencies import hold_message, throttle_holds
from .indexes import GROWABLE, NOTHING, PENDING, REPAIRING, StateIndex, Touched

RefusalKind = Literal["epoch", "unknown-job", "invalid", "overtaken"]
JobState = Literal[
    "pending", "bound", "running", "repairing", "suspended", "completed", "failed", "cancelled", "rejected"
]
NodeStatus = Literal["up", "unreachable", "drained", "lost"]
CheckpointStatus = Literal["committed", "verified", "corrupt", "deleted"]
#: Health verdicts that keep new work off a node.
CORDONING_HEALTH: frozenset[str] = frozenset({"degraded", "failed"})

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "rejected"})
#: States that hold GPUs. A ``repairing`` gang holds its healthy nodes' GPUs while it waits for a
#: replacement node; no rank of it runs.
ACTIVE: frozenset[str] = frozenset({"bound", "running", "repairing"})
#: States whose ranks may be running (launched or being launched).
LAUNCHED: frozenset[str] = frozenset({"bound", "running"})


class NodeView(msgspec.Struct, kw_only=True):
    node_id: str
    address: str
    rack: str
    spine: str
    gpu_type: str
    gpus: tuple[GpuInfo, ...]
    cpu_milli: int
    memory_mib: int
    status: NodeStatus = "up"
    status_reason: str = ""
    agent_instance: str = ""
    registered_at: float = 0.0
    # GPU index -> job id holding it. Absent means free. A GPU fractional jobs share names one of them
    # (the least id) while any share of it is bound; ``shares`` has them all.
    allocated: dict[int, str] = {}
    #: GPU index -> {job id: thousandths} of the fractional jobs sharing it (``JobSpec.gpu_milli``)
    shares: dict[int, dict[str, int]] = {}
    #: GPU index (in MIG mode) -> {job id: its slice} of the MIG jobs on it (``JobSpec.mig_profile``)
    slices: dict[int, dict[str, MigSlice]] = {}
    #: what the node's agent says it is (``zone=a``, ``ib=hdr``): jobs' ``node_selector`` matches them
    labels: dict[str, str] = {}
    #: taints (``key=value`` or ``key``): only jobs that tolerate all of them are placed here
    taints: tuple[str, ...] = ()
    #: what ``labels`` and ``taints`` are made of: the agent's registration and an operator's
    #: ``NodeRulesSet`` (whose label wins over the agent's of the same key)
    agent_labels: dict[str, str] = {}
    agent_taints: tuple[str, ...] = ()
    operator_labels: dict[str, str] = {}
    operator_taints: tuple[str, ...] = ()
    #: The health monitor's verdict on the node's signals (``NodeHealthChanged``): ``degraded`` cordons
    #: the node, ``failed`` drains it too. Silence is ``status``'s business, not this.
    health: str = "healthy"
    health_since: float = 0.0
    health_evidence: tuple[HealthEvidence, ...] = ()
    #: When the node entered ``degraded``, recent first-to-last: the monitor's repeat rule reads it back.
    degraded_at: tuple[float, ...] = ()
    #: Since when the node is out of service for the gangs on it (drained or cordoned; None: it is not):
    #: a drain policy that waits for a job's next checkpoint counts from here.
    out_since: float | None = None
    #: A re-registration that changed what the scheduler places on (GPUs, GPU type, rack, spine): not
    #: applied, the node drained until an operator's undrain accepts it (``_on_undrained``).
    held_registration: NodeRegistered | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def cordoned(self) -> bool:
        """No new work on it: its signals say degraded or failed."""
        return self.health in CORDONING_HEALTH

    @property
    def schedulable(self) -> bool:
        return self.status == "up" and not self.cordoned

    def free_gpus(self) -> tuple[int, ...]:
        """Whole GPUs no job holds (a GPU in MIG mode is never one)."""
        return tuple(g.index for g in self.gpus if g.index not in self.allocated and not g.mig)

    def job_ids(self) -> set[str]:
        """Every job holding a GPU of the node, whole, a share of one or a MIG slice."""
        shared = (j for jobs in self.shares.values() for j in jobs)
        sliced = (j for jobs in self.slices.values() for j in jobs)
        return {*self.allocated.values(), *shared, *sliced}


class CheckpointView(msgspec.Struct, kw_only=True):
    """One committed checkpoint step of a job, as the log tells it."""

    step: int
    attempt: int
    path: str
    manifest_sha256: str
    bytes: int
    shards: int
    save_s: float
    committed_at: float
    status: CheckpointStatus = "committed"
    error: str = ""

    @property
    def complete(self) -> bool:
        """Usable for a resume: committed (and not found corrupt or deleted since)."""
        return self.status in ("committed", "verified")


class ResizeView(msgspec.Struct, kw_only=True):
    """A resize decided (``GangResized``) and not yet carried out: the gang runs on its old placements until
    their ranks have stopped (``JobResized``), then as ``attempt`` on ``placements``. It already holds every
    GPU of both."""

    attempt: int
    placements: tuple[TaskPlacement, ...]
    reason: str
    at: float


class JobView(msgspec.Struct, kw_only=True):
    job_id: str
    spec: JobSpec
    submitted_at: float
    submitted_seq: int
    #: who submitted it (``JobSubmitted.submitted_by``, the API token's user): fair share between a team's
    #: users counts its service to them. Left out of the state hash while None (a log without users keeps
    #: its hash)
    user: str | None = None
    state: JobState = "pending"
    queue: str | None = None
    attempt: int = 0
    placements: tuple[TaskPlacement, ...] = ()
    bound_at: float | None = None
    bound_seq: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    pending_code: str = ""
    pending_message: str = ""
    # The policy's 0-based position among waiting jobs and the ``at`` of the JobPending that said so: the
    # API's queue position, and the clock of the scheduler's rate-limited reason refresh.
    pending_position: int | None = None
    pending_at: float | None = None
    cancel_requested: bool = False
    # Suspend: asked for and not yet done or withdrawn; since when the job is suspended, and for how long
    # it was before (accounting shows suspended time apart from waiting time).
    suspend_requested: bool = False
    suspended_at: float | None = None
    suspended_s: float = 0.0
    ranks_exited: dict[int, int] = {}
    preempt_for: str | None = None
    preempt_reason: str = ""
    preemptions: int = 0
    last_preempted_at: float | None = None
    # Service of the attempts that ended in a preemption (the core's LAS levels and estimates read them):
    # seconds run and GPU-seconds held, from each attempt's start to its preemption.
    run_s: float = 0.0
    attained_gpu_s: float = 0.0
    # Recovery: failures retried so far by cause, when a user-failure retry may bind again, the nodes an
    # interrupted gang lost (and since when it waits for a replacement), work lost in GPU-seconds.
    user_failures: int = 0
    infra_failures: int = 0
    retry_at: float | None = None
    failed_nodes: tuple[str, ...] = ()
    missing_tasks: tuple[int, ...] = ()
    interrupted_at: float | None = None
    lost_gpu_s: float = 0.0
    resume_step: int | None = None
    attempt_reasons: list[str] = []
    # Committed checkpoints by step, oldest first; the commit time of the newest complete one (the core
    # counts a victim's lost work from it).
    checkpoints: list[CheckpointView] = []
    last_checkpoint_at: float | None = None
    last_seq: int = 0
    # An elastic gang's resize waiting for its ranks to stop (None: none). Left out of the state hash while
    # None, so a log without resizes keeps the hash it had before resizes existed.
    resize: ResizeView | None = None

    @property
    def world_size(self) -> int:
        """Ranks of the current attempt: its bound tasks (an elastic or repaired gang may differ from the
        spec's size), else the spec's."""
        tasks = len(self.placements) if self.placements else self.spec.gpus // self.spec.gpus_per_task
        return tasks * self.spec.ranks_per_task

    @property
    def bound_gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    def latest_checkpoint(self) -> CheckpointView | None:
        """The newest complete checkpoint: what every restart resumes from."""
        for checkpoint in reversed(self.checkpoints):
            if checkpoint.complete:
                return checkpoint
        return None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


#: The meaning of the fold: bump it whenever a handler or a field changes what the same log folds into, so
#: snapshots of another version are replayed over instead of restored (2: service of preempted attempts;
#: 3: retries, in-place repair and checkpoints; 4: quarantined messages; 5: a later attempt's commit of a
#: step replaces the earlier record; 6: events on a subject their type may not use are quarantined as
#: misplaced, see ``events.subjects.admissible``; 7: only the current epoch's decisions count, and a bind or
#: repair must keep the job's spec, see ``decision_refusal``; 8: node health verdicts, ``NodeHealthChanged``).
#: 9: a pending job keeps its position and when its reason was written (``pending_position``, ``pending_at``).
#: 10: a rank exit counts only from the node its rank runs on (``foreign_exits``); a re-registration that
#: changes a node's hardware is held for an operator (``NodeView.held_registration``).
#: 11: GPU shares and MIG slices (``NodeView.shares`` / ``slices``, binds onto them), suspend and resume
#: (``JobSuspendRequested``, ``JobSuspended``, ``JobResumed``; the ``suspended`` state).
#: 12: who submitted each job and each team's users' service (``JobView.user``, ``ClusterState.users``).
#: 13: node taints (``NodeView.taints``) and an operator's labels and taints (``NodeRulesSet``).
FOLD_VERSION = 13


# A job's placements, whether it holds their GPUs, and its pending resize (which holds GPUs too): an event
# changed node allocations iff it changed these.
_Holding = tuple[tuple[TaskPlacement, ...], bool, ResizeView | None]
_HOLDS_NOTHING: _Holding = ((), False, None)
_NO_NODES: frozenset[str] = frozenset()


class ClusterState(msgspec.Struct, kw_only=True, dict=True):
    """The fold. ``dict=True`` lets an instance hold its reader index (``StateIndex``) beside the fields:
    encode, to_builtins and so the hash see only the fields."""

    nodes: dict[str, NodeView] = {}
    jobs: dict[str, JobView] = {}
    # Per single-writer role ("scheduler", "preemption"): the newest epoch and who started it.
    epochs: dict[str, int] = {}
    leaders: dict[str, str] = {}
    last_seq: int = 0
    ignored_binds: int = 0
    # Decisions whose epoch is not their leader's current one: a deposed leader's, or forged.
    stale_decisions: int = 0
    orphans: int = 0
    # RankExited naming a rank that its attempt does not run on that node: a node speaking for ranks it
    # never launched. Counted, never applied.
    foreign_exits: int = 0
    # Messages no fold of this version can apply (undecodable, unknown or newer event types): skipped and
    # kept here, so every fold of one log skips the same ones and the hash covers them.
    quarantine: QuarantineLog = msgspec.field(default_factory=QuarantineLog)
    # team -> user -> the GPU service of the user's jobs in the team (``userusage``: fair share between a
    # team's users). Left out of the state hash while empty.
    users: dict[str, dict[str, UserLedger]] = {}

    @property
    def epoch(self) -> int:
        return self.epochs.get("scheduler", 0)

    @property
    def leader_id(self) -> str:
        return self.leaders.get("scheduler", "")

    # -- folding ------------------------------------------------------------------------------

    def apply(self, seq: int, event: Event) -> Touched:
        """Fold one event recorded at stream sequence ``seq``; returns what it may have changed."""
        if isinstance(event, GangsBound):
            return self._apply_members(seq, event.binds)
        handler = _HANDLERS.get(type(event))
        touched = NOTHING
        if handler is not None:
            job_id: str | None = getattr(event, "job_id", None)
            job = self.jobs.get(job_id) if job_id is not None else None
            before = _holding(job) if job is not None else _HOLDS_NOTHING
            handler(self, seq, event)
            touched = self._touched(job_id, getattr(event, "node_id", None), before)
            self._mark_for_readers(touched)
        self.last_seq = max(self.last_seq, seq)
        return touched

    def _apply_members(self, seq: int, binds: tuple[GangBound, ...]) -> Touched:
        """Each of a ``GangsBound``'s binds, in order, as if each were stored alone at ``seq``."""
        jobs: set[str] = set()
        nodes: set[str] = set()
        for bind in binds:
            touched = self.apply(seq, bind)
            if touched.job_id is not None:
                jobs.add(touched.job_id)
            nodes.update(touched.node_ids)
        self.last_seq = max(self.last_seq, seq)
        return Touched(job_id=None, node_ids=frozenset(nodes), more_jobs=frozenset(jobs))

    def apply_stored(self, seq: int, item: Event | Quarantined) -> Touched:
        """Fold what the log stores at ``seq``: an event, or a message this version cannot read, which is
        skipped the same way by every fold and kept in ``quarantine``."""
        if isinstance(item, Quarantined):
            self.quarantine.add(item)
            self.last_seq = max(self.last_seq, seq)
            return NOTHING
        return self.apply(seq, item)

    def _touched(self, job_id: str | None, node_id: str | None, before: _Holding) -> Touched:
        """The event's job, its node, and the nodes of the job's placements before and after when the
        event bound or released GPUs on them (it changed the placements, or whether they are held)."""
        job = self.jobs.get(job_id) if job_id is not None else None
        after = _holding(job) if job is not None else _HOLDS_NOTHING
        if before[0] is after[0] and before[1] == after[1] and before[2] is after[2]:
            return Touched(job_id=job_id, node_ids=_NO_NODES if node_id is None else frozenset((node_id,)))
        nodes = {p.node_id for p in before[0]}
        nodes.update(p.node_id for p in after[0])
        for resize in (before[2], after[2]):
            if resize is not None:
                nodes.update(p.node_id for p in resize.placements)
        if node_id is not None:
            nodes.add(node_id)
        return Touched(job_id=job_id, node_ids=frozenset(nodes))

    def _index(self) -> StateIndex:
        """The reader index as last settled, built from the jobs and nodes on first use (after a decode
        or a copy too)."""
        index: StateIndex | None = self.__dict__.get("_reader_index")
        if index is None:
            index = self.__dict__["_reader_index"] = StateIndex(self.jobs, self.nodes)
        return index

    def _job_index(self) -> StateIndex:
        """The reader index with every job an applied event may have changed refiled: for job lists."""
        index = self._index()
        index.settle_jobs(self.jobs)
        return index

    def _node_index(self) -> StateIndex:
        """The reader index with every node's part of the totals current: for GPU totals."""
        index = self._index()
        index.settle_nodes(self.nodes)
        return index

    def reindex(self) -> None:
        """Drop the reader index (rebuilt on next use): for a state whose views were edited by hand,
        not through ``apply``."""
        self.__dict__.pop("_reader_index", None)

    def _mark_for_readers(self, touched: Touched) -> None:
        """Mark what an event changed for the reader index, which settles it when next read."""
        index = self._index()
        if index.note(touched):
            index.settle_jobs(self.jobs)
            index.settle_nodes(self.nodes)

    # -- queries ------------------------------------------------------------------------------

    def pending_jobs(self) -> list[JobView]:
        """Jobs waiting for a bind (not being cancelled), in arrival order (the log's order)."""
        return list(self._job_index().jobs_of(PENDING))

    def pending_count(self, team: str) -> int:
        """How many of ``team``'s jobs ``pending_jobs`` lists, without listing them."""
        return self._job_index().pending_count(team)

    def ready_jobs(self, now: float) -> list[JobView]:
        """Pending jobs the scheduler may bind at ``now``: a retried job waits out its backoff first, and a
        job with dependencies or a singleton flag waits until they are met (``hold_message``)."""
        index = self._job_index()
        pending = index.jobs_of(PENDING)
        latest_retry = index.latest_retry()
        held = self.held_jobs()
        if (latest_retry is None or latest_retry <= now) and not held:
            return list(pending)
        return [j for j in pending if (j.retry_at is None or j.retry_at <= now) and j.job_id not in held]

    def _own_hold(self, job: JobView) -> str | None:
        """Why ``job``'s dependencies or its name hold it (an array's limit aside)."""
        earlier = self._job_index().same_name_earlier(job) if job.spec.singleton else ()
        return hold_message(job, self.jobs, earlier)

    def held_jobs(self) -> dict[str, str]:
        """Pending jobs held by a dependency, a singleton or an array's limit, with why."""
        index = self._job_index()
        held: dict[str, str] = {}
        arrays: set[str] = set()
        for job_id, job in index.gated().items():
            why = self._own_hold(job)
            if why is not None:
                held[job_id] = why
            if job.spec.array is not None and job.spec.array.max_running is not None:
                arrays.add(job.spec.array.array_id)
        for array_id in sorted(arrays):
            held.update(throttle_holds(index.array_live(array_id), held))
        return held

    def hold_of(self, job: JobView) -> str | None:
        """Why ``job`` is held (``held_jobs``'s answer for it, from its array alone; None: it is not)."""
        array = job.spec.array
        throttled = array is not None and array.max_running is not None
        if job.state != "pending" or not (job.spec.depends_on or job.spec.singleton or throttled):
            return None
        why = self._own_hold(job)
        if why is not None or array is None or not throttled:
            return why
        members = self._job_index().array_live(array.array_id)
        blocked = {m for m, view in members.items() if view.state == "pending" and self._own_hold(view)}
        return throttle_holds(members, blocked).get(job.job_id)

    def dependents_of(self, job_id: str) -> frozenset[str]:
        """Pending jobs waiting on ``job_id`` as a dependency."""
        return self._job_index().dependents(job_id)

    def repairing_jobs(self) -> list[JobView]:
        """Interrupted gangs waiting for a replacement node (not being cancelled), in arrival order."""
        return list(self._job_index().jobs_of(REPAIRING))

    def growable_jobs(self) -> list[JobView]:
        """Launched elastic gangs below their ``max_gpus`` (not being cancelled), in arrival order: the core
        may grow them into idle GPUs even when no job waits."""
        return list(self._job_index().jobs_of(GROWABLE))

    def active_jobs(self) -> list[JobView]:
        """Jobs holding GPUs (bound, running, repairing), in arrival order. A scan, on purpose: its one
        reader (the scheduler's full snapshot rebuild) reads every active job anyway, and a test checks
        that a rebuild sees a double bind made by editing a view by hand, which no index can notice."""
        active = [j for j in self.jobs.values() if j.state in ACTIVE]
        active.sort(key=lambda j: j.submitted_seq)
        return active

    def total_gpus(self, *, schedulable_only: bool = False) -> int:
        index = self._node_index()
        return index.schedulable if schedulable_only else index.total

    def free_gpus(self) -> int:
        return self._node_index().free

    def largest_node_gpus(self) -> int | None:
        """GPUs of the largest node (schedulable or not), or None before any node registered."""
        return self._node_index().largest_node()

    def hash(self) -> str:
        """sha256 over a canonical encoding: equal histories give equal hashes, on any machine."""
        digest = hashlib.sha256()
        for piece in self.canonical_pieces():
            digest.update(piece)
        return digest.hexdigest()

    def canonical_pieces(self) -> Iterator[bytes]:
        """The canonical encoding ``hash`` digests, in pieces of at most one node or job each, so that a
        caller may give its event loop back between them (``Follower.save``, with the fold held still).

        The bytes are those of ``msgspec.json.encode(to_builtins(state), order="deterministic")``: every
        dict's keys sorted, a struct as a dict of its fields; less a job's ``resize`` and ``user`` while
        None and ``users`` while empty, fields added after hashes were first recorded, so that a history
        from before them hashes as it did; and less each user's ``by_day``, derived from ``running``."""
        encode = _canonical_json
        fields = {name: getattr(self, name) for name in self.__struct_fields__}
        if not self.users:
            del fields["users"]
        yield b"{"
        for i, name in enumerate(sorted(fields)):
            yield (b"," if i else b"") + encode(name) + b":"
            value = fields[name]
            if name == "jobs":
                yield from _canonical_dict(value, _job_builtins)
            elif name == "nodes":
                yield from _canonical_dict(value, _builtins)
            elif name == "users":
                yield encode(_users_builtins(value))
            else:
                yield encode(_builtins(value))
        yield b"}"

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(_Snapshot(FOLD_VERSION, self))

    @classmethod
    def decode(cls, data: bytes) -> ClusterState:
        """A snapshot written by ``encode`` of this fold version; anything else raises ValidationError
        (or DecodeError), and the caller replays the log from the start instead."""
        snapshot = msgspec.msgpack.decode(data, type=_Snapshot)
        if snapshot.fold_version != FOLD_VERSION:
            raise msgspec.ValidationError(
                f"snapshot of fold version {snapshot.fold_version}; this fold is version {FOLD_VERSION}"
            )
        return snapshot.state


def _holding(job: JobView) -> _Holding:
    return (job.placements, job.state in ACTIVE, job.resize)


class _Snapshot(msgspec.Struct, array_like=True):
    # Version first, in an array: an older snapshot (a bare map) or another version is refused, never
    # read with new fields at their defaults, which would differ silently from a replay of the same log.
    fold_version: int
    state: ClusterState


# --- handlers ---------------------------------------------------------------------------------


def _job(state: ClusterState, job_id: str, seq: int) -> JobView | None:
    job = state.jobs.get(job_id)
    if job is None:
        state.orphans += 1
        return None
    job.last_seq = seq
    return job


def _release(state: ClusterState, job: JobView) -> None:
    """Free every GPU the job holds: its placements' and a pending resize's."""
    _drop_resize(state, job)
    for placement in job.placements:
        node = state.nodes.get(placement.node_id)
        if node is None:
            continue
        for gpu in placement.gpus:
            _unhold(node, gpu, job.job_id)


def _canonical_json(value: Any) -> bytes:
    return msgspec.json.encode(value, order="deterministic")


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, str_keys=True)


def _users_builtins(users: dict[str, dict[str, UserLedger]]) -> Any:
    """The users' ledgers as the state hash encodes them: without the sums by day (``by_day``), which
    ``running`` determines and hashes recorded before them did not hold."""
    out = _builtins(users)
    for ledgers in out.values():
        for ledger in ledgers.values():
            del ledger["by_day"]
    return out


def _job_builtins(job: JobView) -> Any:
    """A job as the state hash encodes it: without ``resize`` and ``user`` while they are None."""
    out = _builtins(job)
    if out["resize"] is None:
        del out["resize"]
    if out["user"] is None:
        del out["user"]
    return out


def _canonical_dict(items: dict[str, Any], builtins: Callable[[Any], Any]) -> Iterator[bytes]:
    """``items`` as deterministic JSON encodes a dict of ``builtins`` of its values: one piece per item."""
    yield b"{"
    for i, key in enumerate(sorted(items)):
        yield (b"," if i else b"") + _canonical_json(key) + b":" + _canonical_json(builtins(items[key]))
    yield b"}"


def _hold(node: NodeView, gpu: int, job: JobView, placement: TaskPlacement | None = None) -> None:
    """``job`` holds ``gpu`` of ``node``: whole, its share of it (a fractional job) or the slice of its
    ``placement`` (a MIG job). A GPU some shares or slices hold names the least of their jobs in
    ``allocated``."""
    milli = share_milli(job.spec, placement)
    cut = placement.mig if placement is not None else None
    if cut is not None:
        sliced = node.slices.setdefault(gpu, {})
        sliced[job.job_id] = cut
        node.allocated[gpu] = min(sliced)
    elif milli is not None:
        held = node.shares.setdefault(gpu, {})
        held[job.job_id] = milli
        node.allocated[gpu] = min(held)
    else:
        node.allocated[gpu] = job.job_id


def _unhold(node: NodeView, gpu: int, job_id: str) -> None:
    parts: tuple[dict[int, dict[str, int]] | dict[int, dict[str, MigSlice]], ...] = (node.shares, node.slices)
    for part in parts:
        held = part.get(gpu)
        if held is not None and job_id in held:
            del held[job_id]
            if held:
                node.allocated[gpu] = min(held)
                return
            del part[gpu]
    if node.allocated.get(gpu) == job_id:
        del node.allocated[gpu]


def _drop_resize(state: ClusterState, job: JobView) -> None:
    """Forget a pending resize, freeing the GPUs it added (the old placements' stay the job's)."""
    if job.resize is None:
        return
    kept = {(p.node_id, g) for p in job.placements for g in p.gpus}
    _free(state, job, job.resize.placements, keep=kept)
    job.resize = None


def _free(
    state: ClusterState,
    job: JobView,
    placements: tuple[TaskPlacement, ...],
    *,
    keep: set[tuple[str, int]],
) -> None:
    """Free the job's GPUs of ``placements`` except those in ``keep``."""
    for placement in placements:
        node = state.nodes.get(placement.node_id)
        if node is None:
            continue
        for gpu in placement.gpus:
            if (placement.node_id, gpu) not in keep:
                _unhold(node, gpu, job.job_id)


def _finish(state: ClusterState, job: JobView, new_state: JobState, at: float) -> None:
    if job.state in ACTIVE:
        _release(state, job)
        _bill_user(state, job, at)
    job.state = new_state
    job.ended_at = at


def _on_submitted(state: ClusterState, seq: int, e: JobSubmitted) -> None:
    if e.job_id in state.jobs:
        return
    state.jobs[e.job_id] = JobView(
        job_id=e.job_id,
        spec=e.spec,
        submitted_at=e.submitted_at,
        submitted_seq=seq,
        last_seq=seq,
        user=e.submitted_by,
    )


def _on_rejected(state: ClusterState, seq: int, e: JobRejected) -> None:
    job = _job(state, e.job_id, seq)
    if job is None or job.terminal:
        return
    _finish(state, job, "rejected", e.at)
    job.reason = e.reason


def _on_queued(state: ClusterState, seq: int, e: JobQueued) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and not job.terminal:
        job.queue = e.queue


def _on_pending(state: ClusterState, seq: int, e: JobPending) -> None:
    job = _decided(state, seq, e)
    if job is not None:
        job.pending_code = e.code
        job.pending_message = e.message
        job.pending_position = e.position
        job.pending_at = e.at


def _take(state: ClusterState, job: JobView, e: GangBound | GangRepaired, seq: int) -> None:
    """The job holds exactly the decision's GPUs, bound as the decision's attempt."""
    for placement in e.placements:
        node = state.nodes[placement.node_id]
        for gpu in placement.gpus:
            _hold(node, gpu, job, placement)
    job.state = "bound"
    job.attempt = e.attempt
    job.placements = e.placements
    job.bound_at = e.at
    job.bound_seq = seq


def _on_bound(state: ClusterState, seq: int, e: GangBound) -> None:
    job = _decided(state, seq, e)
    if job is None:
        return
    _take(state, job, e, seq)
    if job.queue is None:  # a bind admits: the cycle that binds a job it first sees writes no JobQueued
        job.queue = job.spec.team
    job.pending_code = ""
    job.pending_message = ""
    job.pending_position = None
    job.pending_at = None
    job.ranks_exited = {}
    job.preempt_for = None
    job.retry_at = None


def _on_started(state: ClusterState, seq: int, e: JobStarted) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and job.state == "bound" and job.attempt == e.attempt:
        job.state = "running"
        job.started_at = e.at
        job.resume_step = e.resume_step
        ledger = _user_ledger(state, job)
        if ledger is not None:
            start_attempt(ledger, job.job_id, e.at, job.bound_gpus)


def _on_rank_exited(state: ClusterState, seq: int, e: RankExited) -> None:
    job = _job(state, e.job_id, seq)
    if job is None or job.state not in LAUNCHED or job.attempt != e.attempt:
        return
    if not launched_on(job, e.node_id, e.rank):
        state.foreign_exits += 1
        return
    job.ranks_exited[e.rank] = e.exit_code


def launched_on(job: JobView, node_id: str, rank: int) -> bool:
    """True when the job's current attempt runs ``rank`` on ``node_id`` (ranks are task-major)."""
    task = rank // job.spec.ranks_per_task
    return rank >= 0 and any(p.task == task and p.node_id == node_id for p in job.placements)


def _on_completed(state: ClusterState, seq: int, e: JobCompleted) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and job.state in LAUNCHED and job.attempt == e.attempt:
        _finish(state, job, "completed", e.at)
        job.exit_code = 0


def _on_failed(state: ClusterState, seq: int, e: JobFailed) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and not job.terminal and job.attempt == e.attempt:
        _finish(state, job, "failed", e.at)
        job.exit_code = e.exit_code
        job.reason = e.reason


def _on_cancel_requested(state: ClusterState, seq: int, e: JobCancelRequested) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and not job.terminal:
        job.cancel_requested = True


def _on_suspend_requested(state: ClusterState, seq: int, e: JobSuspendRequested) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and not job.terminal and job.state != "suspended":
        job.suspend_requested = True


def _on_suspended(state: ClusterState, seq: int, e: JobSuspended) -> None:
    """Its ranks stopped (or it was waiting): it holds nothing and waits for a resume."""
    job = _job(state, e.job_id, seq)
    if job is None or job.terminal or not job.suspend_requested:
        return
    if job.state in ACTIVE:
        if job.attempt != e.attempt:
            return
        _requeue(state, job, e.at)
        job.lost_gpu_s += e.lost_gpu_s
    elif job.state != "pending":
        return
    job.state = "suspended"
    job.suspend_requested = False
    job.suspended_at = e.at


def _on_resumed(state: ClusterState, seq: int, e: JobResumed) -> None:
    """Back in the queue at its original place (a resume before the suspension withdraws the request)."""
    job = _job(state, e.job_id, seq)
    if job is None or job.terminal:
        return
    job.suspend_requested = False
    if job.state == "suspended":
        job.state = "pending"
        job.suspended_s += max(0.0, e.at - (job.suspended_at or e.at))
        job.suspended_at = None


def _on_cancelled(state: ClusterState, seq: int, e: JobCancelled) -> None:
    job = _job(state, e.job_id, seq)
    if job is not None and not job.terminal:
        _finish(state, job, "cancelled", e.at)
        job.reason = "cancelled"


def _hardware(e: NodeRegistered | NodeView) -> tuple[object, ...]:
    """What the scheduler places on: a change of it under running gangs is not an agent's to make."""
    return (e.gpus, e.gpu_type, e.rack, e.spine)


def _on_node_registered(state: ClusterState, seq: int, e: NodeRegistered) -> None:
    existing = state.nodes.get(e.node_id)
    if existing is not None and _hardware(existing) != _hardware(e):
        _hold_registration(existing, e)
        return
    _register(state, e)


def _hold_registration(node: NodeView, e: NodeRegistered) -> None:
    """Drain the node and keep the new registration aside until an operator undrains it."""
    node.held_registration = e
    if node.status == "lost":
        return  # nothing runs there; the undrain that accepts it needs the node heard again first
    node.status = "drained"
    node.status_reason = (
        f"re-registered as {len(e.gpus)} {e.gpu_type} GPUs in {e.rack}/{e.spine} "
        f"(was {len(node.gpus)} {node.gpu_type} in {node.rack}/{node.spine}): "
        "held until an operator undrains it"
    )
    if node.out_since is None:
        node.out_since = e.at


def _register(state: ClusterState, e: NodeRegistered) -> None:
    existing = state.nodes.get(e.node_id)
    # A restarted agent re-registers: keep what its GPUs are bound to, the log still says so.
    allocated = existing.allocated if existing is not None else {}
    state.nodes[e.node_id] = NodeView(
        node_id=e.node_id,
        address=e.address,
        rack=e.rack,
        spine=e.spine,
        gpu_type=e.gpu_type,
        gpus=e.gpus,
        cpu_milli=e.cpu_milli,
        memory_mib=e.memory_mib,
        status="up" if existing is None or existing.status != "drained" else "drained",
        status_reason="" if existing is None else existing.status_reason,
        agent_instance=e.agent_instance,
        registered_at=e.at,
        allocated=allocated,
        # and the shares and slices its GPUs hold, which the log still says too
        shares=existing.shares if existing is not None else {},
        slices=existing.slices if existing is not None else {},
        agent_labels=dict(e.labels),
        agent_taints=e.taints,
        operator_labels=existing.operator_labels if existing is not None else {},
        operator_taints=existing.operator_taints if existing is not None else (),
    )
    _apply_rules(state.nodes[e.node_id])
    if existing is not None:  # a restarted agent does not clear what its signals said
        kept = state.nodes[e.node_id]
        kept.health, kept.health_since = existing.health, existing.health_since
        kept.health_evidence, kept.degraded_at = existing.health_evidence, existing.degraded_at
        kept.out_since = existing.out_since


def _apply_rules(node: NodeView) -> None:
    """The node's labels and taints: its agent's with its operator's on top."""
    node.labels = {**node.agent_labels, **node.operator_labels}
    node.taints = tuple(sorted({*node.agent_taints, *node.operator_taints}))


def _on_rules_set(state: ClusterState, seq: int, e: NodeRulesSet) -> None:
    node = _node(state, e.node_id)
    if node is not None:
        # a new view, not an in-place change: the scheduler's model sync compares views by identity
        # (``model_sync.NODE_MUTABLE``) and rebuilds on a node whose rules changed
        node = state.nodes[e.node_id] = msgspec.structs.replace(
            node, operator_labels=dict(e.labels), operator_taints=e.taints
        )
        _apply_rules(node)


def _node(state: ClusterState, node_id: str) -> NodeView | None:
    node = state.nodes.get(node_id)
    if node is None:
        state.orphans += 1
    return node


def _on_heartbeat_lost(state: ClusterState, seq: int, e: NodeHeartbeatLost) -> None:
    node = _node(state, e.node_id)
    if node is not None and node.status == "up":
        node.status = "unreachable"
        node.status_reason = "heartbeat lost"


def _on_drained(state: ClusterState, seq: int, e: NodeDrained) -> None:
    node = _node(state, e.node_id)
    if node is not None and node.status != "lost":
        node.status = "drained"
        node.status_reason = e.reason
        if node.out_since is None:
            node.out_since = e.at


def _on_lost(state: ClusterState, seq: int, e: NodeLost) -> None:
    node = _node(state, e.node_id)
    if node is not None:
        node.status = "lost"
        node.status_reason = e.reason


def _on_recovered(state: ClusterState, seq: int, e: NodeRecovered) -> None:
    # The health monitor's verdict on silence (unreachable or lost -> heard again) never undoes a drain:
    # its appends are not fenced, so one decided on a view from before an operator's drain may land after it.
    node = _node(state, e.node_id)
    if node is not None and node.held_registration is not None and node.status == "lost":
        _hold_registration(node, node.held_registration)  # heard again: still waits for the operator
    elif node is not None and node.status != "drained":
        node.status = "up"
        node.status_reason = ""


def _on_undrained(state: ClusterState, seq: int, e: NodeUndrained) -> None:
    # Only a drained node returns to service: an undrain racing a NodeLost leaves the node lost.
    node = _node(state, e.node_id)
    if node is not None and node.status == "drained":
        if node.held_registration is not None:  # the operator accepts the node's new hardware
            _register(state, node.held_registration)
            node = state.nodes[e.node_id]
        node.status = "up"
        node.status_reason = ""
    if node is not None and node.status == "up":
        # The operator has looked at the node: whatever its signals said (a hard fault included) is
        # cleared, and the monitor judges it afresh from what its GPUs say now.
        node.health, node.health_since, node.health_evidence = "healthy", e.at, ()
        node.out_since = None


def _on_health_changed(state: ClusterState, seq: int, e: NodeHealthChanged) -> None:
    node = _node(state, e.node_id)
    if node is None:
        return
    # a return to health carries what it recovered from; the view keeps evidence of a standing verdict only
    node.health, node.health_since = e.state, e.at
    node.health_evidence = e.evidence if e.state != "healthy" else ()
    if e.state == "degraded":
        node.degraded_at = (*node.degraded_at, e.at)
    if e.state == "failed" and node.status != "lost":
        # A hard fault drains the node: only an operator's undrain brings it back.
        node.status = "drained"
        node.status_reason = "failed: " + describe_evidence(e.evidence)
    if e.state in CORDONING_HEALTH:
        if node.out_since is None:
            node.out_since = e.at
    elif node.status != "drained":
        node.out_since = None


def describe_evidence(evidence: tuple[HealthEvidence, ...]) -> str:
    """``gpu 3 ecc_uncorrectable 2 >= 1; nic ib0 nic_flaps 3 >= 3 in 600 s``: what an operator reads."""
    parts = []
    for f in evidence:
        window = f" in {f.window_s:g} s" if f.window_s else ""
        parts.append(f"{f.subject} {f.signal} {f.value:g} >= {f.threshold:g}{window}")
    return "; ".join(parts) or "no evidence recorded"


def _on_epoch(state: ClusterState, seq: int, e: LeaderEpochStarted) -> None:
    if e.epoch > state.epochs.get(e.role, 0):
        state.epochs[e.role] = e.epoch
        state.leaders[e.role] = e.leader_id


def _on_preemption_requested(state: ClusterState, seq: int, e: PreemptionRequested) -> None:
    job = _decided(state, seq, e)
    if job is not None:
        job.preempt_for = e.for_job
        job.preempt_reason = e.reason


def _on_preempted(state: ClusterState, seq: int, e: JobPreempted) -> None:
    job = _job(state, e.job_id, seq)
    if job is None or job.state not in ACTIVE or job.attempt != e.attempt:
        return
    _requeue(state, job, e.at)
    job.preemptions += 1
    job.last_preempted_at = e.at
    job.lost_gpu_s += e.lost_gpu_s


def _account_service(job: JobView, at: float) -> None:
    """Add the ending attempt's run to the job's service (the core's LAS levels and estimates read it):
    GPU-seconds where a share or a MIG slice counts for its part of a GPU (``quota_milli``), as quota and
    DRF count it; a gang's every GPU, the same float as its GPU count times the run."""
    if job.started_at is not None:
        ran = max(0.0, at - job.started_at)
        job.run_s += ran
        job.attained_gpu_s += ran * (quota_milli(job.spec, job.placements) / GPU_MILLI)


def _user_ledger(state: ClusterState, job: JobView) -> UserLedger | None:
    """The service record of the job's user in its team (None: the job has no user)."""
    if job.user is None:
        return None
    team = state.users.setdefault(job.spec.team, {})
    ledger = team.get(job.user)
    if ledger is None:
        ledger = team[job.user] = UserLedger()
    return ledger


def _bill_user(state: ClusterState, job: JobView, at: float) -> None:
    """The job's running attempt ended at ``at``: bill it to its user (``userusage``)."""
    if job.user is not None:
        ledger = state.users.get(job.spec.team, {}).get(job.user)
        if ledger is not None:
            end_attempt(ledger, job.job_id, at)


def _requeue(state: ClusterState, job: JobView, at: float) -> None:
    """Release every GPU and put the job back in the queue at its original place (next bind: attempt + 1)."""
    _release(state, job)
    _account_service(job, at)
    _bill_user(state, job, at)
    job.state = "pending"
    job.placements = ()
    job.bound_at = job.bound_seq = job.started_at = None
    job.ranks_exited = {}
    job.preempt_for = None
    job.failed_nodes = ()
    job.missing_tasks = ()
    job.interrupted_at = None


def _on_attempt_failed(state: ClusterState, seq: int, e: JobAttemptFailed) -> None:
    job = _job(state, e.job_id, seq)
    if job is None or job.state not in ACTIVE or job.attempt != e.attempt:
        return
    _requeue(state, job, e.at)
    if e.cause == "user":
        job.user_failures += 1
    else:
        job.infra_failures += 1
    job.retry_at = e.retry_at
    job.lost_gpu_s += e.lost_gpu_s
    job.reason = e.reason
    job.attempt_reasons.append(f"attempt {e.attempt}: {e.reason}")


def _on_interrupted(state: ClusterState, seq: int, e: JobInterrupted) -> None:
    job = _job(state, e.job_id, seq)
    if job is None or job.state not in LAUNCHED or job.attempt != e.attempt:
        return
    _drop_resize(state, job)  # a resize of a broken gang cannot be carried out: the repair decides anew
    failed = set(e.failed_nodes)
    kept = tuple(p for p in job.placements if p.node_id not in failed)
    for placement in job.placements:
        node = state.nodes.get(placement.node_id)
        if node is None or placement.node_id not in failed:
            continue
        for gpu in placement.gpus:
            _unhold(node, gpu, job.job_id)
    _account_service(job, e.at)
    _bill_user(state, job, e.at)
    job.state = "repairing"
    job.missing_tasks = tuple(sorted(p.task for p in job.placements if p.node_id in failed))
    job.placements = kept
    job.started_at = None
    job.ranks_exited = {}
    job.failed_nodes = tuple(sorted(failed))
    job.interrupted_at = e.at
    job.infra_failures += 1
    job.lost_gpu_s += e.lost_gpu_s
    job.reason = e.reason
    job.attempt_reasons.append(f"attempt {e.attempt}: {e.reason}")


def _on_repaired(state: ClusterState, seq: int, e: GangRepaired) -> None:
    job = _decided(state, seq, e)
    if job is None:
        return
    _release(state, job)
    _take(state, job, e, seq)
    job.ranks_exited = {}
    job.failed_nodes = ()
    job.missing_tasks = ()
    job.interrupted_at = None


def _on_requeued(state: ClusterState, seq: int, e: JobRequeued) -> None:
    job = _decided(state, seq, e)
    if job is None:
        return
    _requeue(state, job, e.at)
    job.reason = e.reason


def _on_gang_resized(state: ClusterState, seq: int, e: GangResized) -> None:
    """The gang takes the GPUs it adds now; it keeps running on its old placements until they stop."""
    job = _decided(state, seq, e)
    if job is None:
        return
    for placement in e.placements:
        node = state.nodes[placement.node_id]
        for gpu in placement.gpus:
            _hold(node, gpu, job)
    job.resize = ResizeView(attempt=e.attempt, placements=e.placements, reason=e.reason, at=e.at)


def _on_job_resized(state: ClusterState, seq: int, e: JobResized) -> None:
    """The old attempt's ranks stopped: free the GPUs the resize drops, bind the new size as a new attempt
    (the job controller launches it, resuming from the newest complete checkpoint)."""
    job = _job(state, e.job_id, seq)
    if job is None or job.resize is None or job.state not in LAUNCHED or job.attempt != e.attempt:
        return
    resize = job.resize
    kept = {(p.node_id, g) for p in resize.placements for g in p.gpus}
    _free(state, job, job.placements, keep=kept)
    _account_service(job, e.at)
    _bill_user(state, job, e.at)
    job.lost_gpu_s += e.lost_gpu_s
    job.resize = None
    job.state = "bound"
    job.attempt = resize.attempt
    job.placements = resize.placements
    job.bound_at = e.at
    job.bound_seq = seq
    job.started_at = None
    job.ranks_exited = {}


# --- decisions: which ones count ----------------------------------------------------------------

Decision = GangBound | GangRepaired | JobRequeued | JobPending | PreemptionRequested | GangResized

#: The single-writer role (``LeaderEpochStarted.role``) whose leader makes each kind of decision.
DECISION_ROLES: dict[type, str] = {
    GangBound: "scheduler",
    GangRepaired: "scheduler",
    JobRequeued: "scheduler",
    JobPending: "scheduler",
    PreemptionRequested: "scheduler",
    GangResized: "scheduler",
}


def decision_role(e: Decision) -> str:
    """The role whose current epoch ``e`` must carry.

    The cutover: a ``PreemptionRequested`` says which role wrote it. Those recorded before the scheduler
    wrote a cycle's whole output (no ``role`` field: "preemption") are judged, as they always were, by the
    preemption leader's epoch, so old logs fold and audit exactly as before; new ones by the scheduler's.
    The subject rules bind each role to its own tree (``subjects.for_event``), so only the scheduler's
    permissions can write a "scheduler" request, and no service writes "preemption" ones any more."""
    if isinstance(e, PreemptionRequested):
        return e.role
    return DECISION_ROLES[type(e)]


class Refusal(msgspec.Struct, frozen=True):
    """Why the fold does not apply a decision. ``epoch``: not the current leader's (stale or forged);
    ``unknown-job``; ``invalid``: it could never have been right (a GPU that is not free or does not exist,
    a gang that breaks the job's spec); ``overtaken``: right when computed, but the job or a node changed
    before it was appended (a cancel, a node lost), which no fencing prevents."""

    kind: RefusalKind
    why: str


def decision_refusal(state: ClusterState, e: Decision) -> Refusal | None:
    """Why ``e`` would not be applied to ``state`` now, or None when it would. Pure; the fold and the audit
    (``rally replay --verify-decisions``) both ask it, so they never disagree."""
    role = decision_role(e)
    current = state.epochs.get(role, 0)
    if current == 0 or e.epoch != current:
        leader = f"the {role} leader's epoch is {current}" if current else f"no {role} leader has started"
        return Refusal("epoch", f"epoch {e.epoch}, but {leader}")
    job = state.jobs.get(e.job_id)
    if job is None:
        return Refusal("unknown-job", f"no job {e.job_id}")
    if isinstance(e, GangBound):
        return _bind_refusal(state, job, e)
    if isinstance(e, GangRepaired):
        return _repair_refusal(state, job, e)
    if isinstance(e, GangResized):
        return _resize_refusal(state, job, e)
    if isinstance(e, JobRequeued):
        ok = job.state == "repairing" and job.attempt == e.attempt
        return None if ok else Refusal("overtaken", f"job {job.state} at attempt {job.attempt}")
    if isinstance(e, JobPending):
        return None if job.state == "pending" else Refusal("overtaken", f"job {job.state}")
    ok = job.state in ACTIVE and job.attempt == e.attempt and job.preempt_for is None
    return None if ok else Refusal("overtaken", f"job {job.state} at attempt {job.attempt}")


def _decided(state: ClusterState, seq: int, e: Decision) -> JobView | None:
    """The job a decision applies to, or None when the fold refuses it: a refused decision changes nothing
    but its counter (an unknown job counts as an orphan, like any event's)."""
    refusal = decision_refusal(state, e)
    if refusal is None:
        return _job(state, e.job_id, seq)
    if refusal.kind == "epoch":
        state.stale_decisions += 1
    elif refusal.kind == "unknown-job":
        state.orphans += 1
    elif isinstance(e, GangBound | GangRepaired | GangResized):
        state.ignored_binds += 1
    return None


def _bind_refusal(state: ClusterState, job: JobView, e: GangBound) -> Refusal | None:
    if job.state != "pending" or job.cancel_requested:
        return Refusal("overtaken", "job cancelled" if job.cancel_requested else f"job {job.state}")
    if e.attempt != job.attempt + 1:
        return Refusal("invalid", f"attempt {e.attempt} after attempt {job.attempt}")
    return _placement_refusal(state, job, e.placements, held=frozenset())


def _repair_refusal(state: ClusterState, job: JobView, e: GangRepaired) -> Refusal | None:
    if job.state != "repairing" or job.cancel_requested:
        return Refusal("overtaken", "job cancelled" if job.cancel_requested else f"job {job.state}")
    if e.attempt != job.attempt + 1:
        return Refusal("invalid", f"attempt {e.attempt} after attempt {job.attempt}")
    held = frozenset((p.node_id, g) for p in job.placements for g in p.gpus)
    return _placement_refusal(state, job, e.placements, held=held)


def _resize_refusal(state: ClusterState, job: JobView, e: GangResized) -> Refusal | None:
    """A running gang, not already stopping (preempted, cancelled or resizing), resized as its next attempt
    onto GPUs it holds or that are free."""
    if job.cancel_requested:
        return Refusal("overtaken", "job cancelled")
    if job.state not in LAUNCHED or job.preempt_for is not None:
        return Refusal("overtaken", f"job {job.state}" + (" and preempted" if job.preempt_for else ""))
    if job.resize is not None:
        return Refusal("overtaken", f"a resize to attempt {job.resize.attempt} is under way")
    if e.attempt != job.attempt + 1:
        return Refusal("invalid", f"attempt {e.attempt} after attempt {job.attempt}")
    held = frozenset((p.node_id, g) for p in job.placements for g in p.gpus)
    return _placement_refusal(state, job, e.placements, held=held)


def _placement_refusal(
    state: ClusterState,
    job: JobView,
    placements: tuple[TaskPlacement, ...],
    *,
    held: frozenset[tuple[str, int]],
) -> Refusal | None:
    """Every GPU named exists, once, and is free (or ``held``: kept by the gang through a failure) on a node
    that is up; and the gang keeps the job's spec."""
    if not placements:
        return Refusal("invalid", "no placements")
    seen: set[tuple[str, int]] = set()
    for placement in placements:
        node = state.nodes.get(placement.node_id)
        if node is None:
            return Refusal("invalid", f"no node {placement.node_id}")
        indices = {g.index for g in node.gpus}
        schedulable = node.schedulable  # once per node, not per GPU: judging a decision changes no node
        for gpu in placement.gpus:
            key = (placement.node_id, gpu)
            if gpu not in indices or key in seen:
                return Refusal("invalid", f"GPU {gpu} of {node.node_id} does not exist or is named twice")
            seen.add(key)
            if key in held:
                continue  # a GPU the gang kept through the failure
            if not schedulable:
                return Refusal("overtaken", f"node {node.node_id} is {node.status}")
            refusal = _gpu_refusal(node, gpu, job.spec, placement)
            if refusal is not None:
                return refusal
    return _spec_refusal(state, job.spec, placements)


def _gpu_refusal(node: NodeView, gpu: int, spec: JobSpec, placement: TaskPlacement) -> Refusal | None:
    """Whether the job may take ``gpu``: a MIG job a free slice of a MIG GPU, a fractional job room on a
    shared GPU or a free one, any other job a free whole GPU."""
    cut = placement.mig
    mig = any(g.mig for g in node.gpus if g.index == gpu)
    if spec.mig_profile is not None or cut is not None:
        if cut is None or not mig or cut.profile != spec.mig_profile:
            return Refusal("invalid", f"a MIG job gets a {spec.mig_profile} slice of a MIG GPU, not {cut}")
        if not _slice_fits(node, gpu, cut):
            return Refusal(
                "invalid", f"slice {cut.profile} at {cut.start} of GPU {gpu} of {node.node_id} is taken"
            )
        return None
    if mig:
        return Refusal("invalid", f"GPU {gpu} of {node.node_id} is in MIG mode")
    milli = share_milli(spec, placement)
    if (spec.gpu_memory_mib is None) != (placement.milli is None) or not 0 < (milli or 1) <= GPU_MILLI:
        return Refusal("invalid", f"a share asking for GPU memory holds 1-1000 thousandths, named: {milli}")
    if gpu in node.allocated and not _share_fits(node, gpu, milli):
        return Refusal("invalid", f"GPU {gpu} of {node.node_id} is held by {node.allocated[gpu]}")
    return None


def _slice_fits(node: NodeView, gpu: int, cut: MigSlice) -> bool:
    """``cut`` is a slice the node's GPU model offers, and no slice held on that GPU overlaps it."""
    # here, not at the top: the fold is imported by tools that never load the core (numpy)
    from rallypoint.core.mig import MigInstance, free_mask, mig_model

    model = mig_model(node.gpu_type)
    profile = next((p for p in model.profiles if p.name == cut.profile), None) if model else None
    if model is None or profile is None or cut.start not in profile.starts:
        return False
    held = [MigInstance(s.profile, s.start, True) for s in node.slices.get(gpu, {}).values()]
    return not profile.mask_at(cut.start) & ~free_mask(model, held)


def _share_fits(node: NodeView, gpu: int, milli: int | None) -> bool:
    """A fractional job's share still fits on a GPU other fractional jobs share."""
    held = node.shares.get(gpu)
    return milli is not None and held is not None and sum(held.values()) + milli <= GPU_MILLI


def _spec_refusal(
    state: ClusterState, spec: JobSpec, placements: tuple[TaskPlacement, ...]
) -> Refusal | None:
    """A gang binds on one GPU type the job accepts, as tasks 0..n-1 of ``gpus_per_task`` GPUs each, with
    the spec's GPU count or (elastic) one in its min..max range."""
    types = sorted({state.nodes[p.node_id].gpu_type for p in placements})
    allowed = spec.gpu_types or ((spec.gpu_type,) if spec.gpu_type is not None else None)
    if len(types) != 1 or (allowed is not None and types[0] not in allowed):
        wanted = ", ".join(allowed) if allowed is not None else "one type"
        return Refusal("invalid", f"GPU type {', '.join(types)} on a job that needs {wanted}")
    if sorted(p.task for p in placements) != list(range(len(placements))):
        return Refusal("invalid", "tasks are not numbered 0..n-1 once each")
    for placement in placements:
        if len(placement.gpus) != spec.gpus_per_task:
            count = len(placement.gpus)
            return Refusal("invalid", f"task {placement.task} has {count} GPUs, not {spec.gpus_per_task}")
    total = len(placements) * spec.gpus_per_task
    low = spec.gpus if spec.min_gpus is None else spec.min_gpus
    high = spec.gpus if spec.max_gpus is None else spec.max_gpus
    if not low <= total <= high:
        return Refusal("invalid", f"{total} GPUs, the job takes {low}..{high}")
    return None


def _checkpoint(state: ClusterState, job_id: str, step: int, seq: int) -> CheckpointView | None:
    job = state.jobs.get(job_id)
    if job is None:
        state.orphans += 1
        return None
    for checkpoint in job.checkpoints:
        if checkpoint.step == step:
            return checkpoint
    return None


def _on_checkpoint_committed(state: ClusterState, seq: int, e: CheckpointCommitted) -> None:
    job = state.jobs.get(e.job_id)
    if job is None:
        state.orphans += 1
        return
    existing = _checkpoint(state, e.job_id, e.step, seq)
    if existing is not None:
        if e.attempt <= existing.attempt:
            return  # a repeat (the agent retried the append): the first record stands
        # a later attempt saved this step again (it resumed from an older one): its files replaced the
        # earlier ones, so its record does too
        job.checkpoints.remove(existing)
    view = CheckpointView(
        step=e.step,
        attempt=e.attempt,
        path=e.path,
        manifest_sha256=e.manifest_sha256,
        bytes=e.bytes,
        shards=e.shards,
        save_s=e.save_s,
        committed_at=e.at,
    )
    job.checkpoints.append(view)
    job.checkpoints.sort(key=lambda c: c.step)
    _refresh_last_checkpoint(job)


def _refresh_last_checkpoint(job: JobView) -> None:
    latest = job.latest_checkpoint()
    job.last_checkpoint_at = latest.committed_at if latest is not None else None


def _on_checkpoint_verified(state: ClusterState, seq: int, e: CheckpointVerified) -> None:
    checkpoint = _checkpoint(state, e.job_id, e.step, seq)
    if checkpoint is None or checkpoint.status == "deleted":
        return
    checkpoint.status = "verified" if e.ok else "corrupt"
    checkpoint.error = e.error
    _refresh_last_checkpoint(state.jobs[e.job_id])


def _on_checkpoint_deleted(state: ClusterState, seq: int, e: CheckpointDeleted) -> None:
    checkpoint = _checkpoint(state, e.job_id, e.step, seq)
    if checkpoint is not None:
        checkpoint.status = "deleted"
        checkpoint.error = e.reason
        _refresh_last_checkpoint(state.jobs[e.job_id])


_HANDLERS: dict[type, Callable[[ClusterState, int, Any], None]] = {
    JobSubmitted: _on_submitted,
    JobRejected: _on_rejected,
    JobQueued: _on_queued,
    JobPending: _on_pending,
    GangBound: _on_bound,
    JobStarted: _on_started,
    RankExited: _on_rank_exited,
    JobCompleted: _on_completed,
    JobFailed: _on_failed,
    JobCancelRequested: _on_cancel_requested,
    JobSuspendRequested: _on_suspend_requested,
    JobSuspended: _on_suspended,
    JobResumed: _on_resumed,
    JobCancelled: _on_cancelled,
    NodeRegistered: _on_node_registered,
    NodeHeartbeatLost: _on_heartbeat_lost,
    NodeDrained: _on_drained,
    NodeLost: _on_lost,
    NodeRecovered: _on_recovered,
    NodeUndrained: _on_undrained,
    NodeRulesSet: _on_rules_set,
    NodeHealthChanged: _on_health_changed,
    LeaderEpochStarted: _on_epoch,
    PreemptionRequested: _on_preemption_requested,
    JobPreempted: _on_preempted,
    JobAttemptFailed: _on_attempt_failed,
    JobInterrupted: _on_interrupted,
    GangRepaired: _on_repaired,
    JobRequeued: _on_requeued,
    GangResized: _on_gang_resized,
    JobResized: _on_job_resized,
    CheckpointCommitted: _on_checkpoint_committed,
    CheckpointVerified: _on_checkpoint_verified,
    CheckpointDeleted: _on_checkpoint_deleted,
}
