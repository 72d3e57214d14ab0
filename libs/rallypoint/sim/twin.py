"""The twin: one workload through the simulator and, at the same instants, through the live fold and bridge.

The simulator calls the core at each scheduling instant (``Simulator(scheduler=...)``). The twin wraps that
call: first it brings a live ``ClusterState`` level with the simulated world by appending the events the
live services would have appended since the last call (``JobSubmitted`` from the API, ``JobCompleted`` and
``JobStarted`` from the job controller, ``CheckpointCommitted`` from the agents, ``NodeLost`` /
``NodeRecovered`` and ``JobAttemptFailed`` for failed nodes), then it runs the scheduler's cycle the way
``services/scheduler/leader.py`` runs it (admissions, ``cycle_needed``, then
``SchedulingPolicy.decide_live`` on the fold, told what the events touched), and also the audit's fresh
rebuild (what ``rally replay --verify-decisions`` recomputes). The simulator's own decisions are computed on
its own snapshot. The three are encoded canonically (msgspec JSON of ``core.types.Decisions``) and must be
equal byte for byte; so must the two snapshots' inputs (``canonical_inputs``). Then the live decisions are
appended as the scheduler appends them (``bridge.decision_writes``: ``GangBound``, ``GangResized``,
``PreemptionRequested``, ``JobPending``, ``JobRejected``) and carried out at once, as the simulator carries
out its own (``JobStarted``, ``JobResized``, ``JobPreempted``): the fold then folds the live writes, never
the simulator's, so a live decision the fold refuses (``ignored_binds``) is caught too.

Pure and deterministic like the simulator: no clock, no I/O, the simulator's trace time as ``at`` and
``now`` everywhere. tests/sim/test_twin.py runs it in CI; ``rally sim twin`` on any workload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from rallypoint.core import schedule
from rallypoint.core import types as ct
from rallypoint.events import (
    CheckpointCommitted,
    Event,
    GangBound,
    GangResized,
    GpuInfo,
    JobAttemptFailed,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobResized,
    JobResumed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSuspended,
    JobSuspendRequested,
    LeaderEpochStarted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    PreemptionRequested,
    subjects,
)
from rallypoint.scheduling import SchedulingPolicy, build_snapshot
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.cycle import decide, writes_before_deciding
from rallypoint.scheduling.pending import NEVER_FITS
from rallypoint.scheduling.queues import Queues
from rallypoint.scheduling.writes import Write
from rallypoint.state import ACTIVE, ClusterState, JobView, Touched
from rallypoint.state.dependencies import never_met

from .cluster import Cluster, Node
from .engine import SimOptions, Simulator, _SimJob
from .workload import Job

EPOCH = 1
LEADER = "twin"


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """One cycle whose decisions differ: the canonical bytes of each side."""

    cycle: int
    now: float
    sim: str
    live: str
    audit: str


class TwinReport(msgspec.Struct, kw_only=True):
    """What the twin compared: cycles, the decisions they held, and every difference found."""

    cycles: int = 0
    binds: int = 0
    preemptions: int = 0
    resizes: int = 0
    rejections: int = 0
    reasons: int = 0
    checkpoints: int = 0  # CheckpointCommitted told to the live fold
    # how often each pending code and each preemption reason was decided (what the comparison covered)
    codes: dict[str, int] = {}
    preemption_reasons: dict[str, int] = {}
    mismatches: list[Mismatch] = []
    # cycles whose core inputs differ (``canonical_inputs``; ``audit`` empty): every job, node, queue
    input_mismatches: list[Mismatch] = []
    # live writes the fold did not apply (a bind onto held GPUs, a stale decision): never expected
    ignored_binds: int = 0
    stale_decisions: int = 0
    # the jobs each side rejected (the simulator's admission and core rules, the fold's JobRejected)
    rejected_sim: list[str] = []
    rejected_live: list[str] = []
    sim_summary: dict[str, object] = {}

    @property
    def identical(self) -> bool:
        """Every cycle's inputs and decisions equal, every live write applied, the same jobs rejected."""
        differ = self.mismatches or self.input_mismatches or self.ignored_binds or self.stale_decisions
        return not differ and self.rejected_sim == self.rejected_live


def job_spec(job: Job, priority: str) -> JobSpec:
    """The spec the API would append for ``job`` (the simulator's job, with its resolved priority class)."""
    types = job.gpu_types
    limit = job.time_limit
    if limit is not None and limit != int(limit):
        raise ValueError(f"job {job.id}: a live time limit is whole seconds, got {limit}")
    return JobSpec(
        name=job.job_name,
        team=job.team,
        gpus=job.gpus,
        gpus_per_task=job.task_gpus,
        ranks_per_task=1,
        command=("train",),
        priority=priority,
        time_limit_s=None if limit is None else int(limit),
        gpu_type=types[0] if len(types) == 1 else None,
        gpu_types=types if len(types) > 1 else None,
        min_gpus=job.min_gpus,
        max_gpus=job.max_gpus,
        gpu_step=job.gpu_step,
        depends_on=job.depends_on,
        singleton=job.singleton,
        array=job.array,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        gpu_milli=job.gpu_milli,
        gpu_memory_mib=job.gpu_memory_mib,
        mig_profile=job.mig_profile,
        node_selector=dict(job.node_selector),
        tolerations=tuple(sorted(set(job.tolerations))),
        affinity=job.affinity,
        kind=job.kind,
    )


def node_registered(node: Node, at: float) -> NodeRegistered:
    """The inventory's registration of a simulated node: its GPUs, numbered, in their NVLink domains."""
    size = node.nvlink_domain or node.gpus or 1
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"{node.id}-gpu{i}",
            memory_mib=node.gpu_memory,
            nvlink_domain=i // size,
            mig=i in node.mig_gpus,
        )
        for i in range(node.gpus)
    )
    return NodeRegistered(
        node_id=node.id,
        address=node.id,
        rack=node.rack,
        spine=node.spine,
        gpu_type=node.gpu_type,
        gpus=gpus,
        cpu_milli=node.cpu,
        memory_mib=node.memory,
        agent_instance=LEADER,
        at=at,
        labels=dict(node.labels),
        taints=tuple(sorted(set(node.taints))),
    )


@dataclass
class _Changes:
    """What the fold's events touched since the scheduler last synced (``model_sync.Changed``)."""

    jobs: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    everything: bool = True  # the first sync looks at everything, as a new follower's does

    def add(self, touched: Touched) -> None:
        if touched.job_id is not None:
            self.jobs.add(touched.job_id)
        self.jobs.update(touched.more_jobs)
        self.nodes.update(touched.node_ids)

    def take(self) -> _Changes:
        taken = _Changes(set(self.jobs), set(self.nodes), self.everything)
        self.jobs.clear()
        self.nodes.clear()
        self.everything = False
        return taken


@dataclass(frozen=True)
class LiveCycle:
    """One live cycle: its decisions, the audit's, the fresh snapshot the audit decided on (None: the
    leader skipped the cycle) and the writes still to append (the decisions', then admissions)."""

    live: ct.Decisions
    audit: ct.Decisions
    snapshot: ct.Snapshot | None
    writes: list[Write]


def canonical_inputs(snap: ct.Snapshot) -> bytes:
    """Everything the core reads from ``snap``, canonically encoded: jobs and nodes by id. ``arrival`` is
    each side's own counter (the simulator counts submissions, the live side has the log's sequence) and the
    core only compares arrivals, so each job's is replaced by its rank in arrival order: the order must
    agree, the numbers need not."""
    by_arrival = sorted(snap.pending, key=lambda p: (p.arrival, p.id))
    ranked = sorted(
        (msgspec.structs.replace(p, arrival=rank) for rank, p in enumerate(by_arrival)), key=lambda p: p.id
    )
    running = sorted(snap.cluster.running.values(), key=lambda j: j.id)
    nodes = sorted(snap.cluster.nodes.values(), key=lambda n: n.id)
    return msgspec.json.encode(
        [snap.now, ranked, running, nodes, snap.queues, snap.priority_classes, snap.user_usage]
    )


class LiveSide:
    """The live fold and the scheduler's cycle over it, fed with what the live services would append."""

    def __init__(self, cluster: Cluster, policy: SchedulingPolicy) -> None:
        self.state = ClusterState()
        self.policy = policy
        self.seq = 0
        self.epoch = EPOCH
        self.changes = _Changes()
        for node in cluster.nodes:
            self.append(node_registered(node, 0.0))
        self.append(LeaderEpochStarted(epoch=EPOCH, leader_id=LEADER, role="scheduler", at=0.0))

    @classmethod
    def over(cls, state: ClusterState, policy: SchedulingPolicy) -> LiveSide:
        """The cycle over a fold the caller gives away (a copy of a live one: the predictor's fork), as
        its current leader decides: that epoch's decisions are the ones the fold applies."""
        side = cls.__new__(cls)
        side.state, side.policy, side.seq, side.epoch = state, policy, state.last_seq, state.epoch
        side.changes = _Changes()
        return side

    def append(self, event: Event) -> None:
        self.seq += 1
        self.changes.add(self.state.apply(self.seq, event))

    def cycle(self, now: float) -> LiveCycle:
        """The leader's cycle at ``now``: admissions (rejections folded first), then the decisions on the
        incrementally synced model; also the audit's decisions on a fresh snapshot."""
        first, admissions = writes_before_deciding(self.state, now, repairs=())
        for write in first:
            self.append(write.event)
        decided = decide(self.policy, self.state, now, self.changes, epoch=self.epoch, admissions=admissions)
        if decided is None:
            # the leader skips the cycle: it decides nothing
            nothing = ct.Decisions(policy=self.policy.policy.name, now=now)
            return LiveCycle(nothing, nothing, None, admissions)
        live, writes = decided
        fresh = build_snapshot(
            self.state, now, queues=self.policy.queues, priority_classes=self.policy.priority_classes
        )
        return LiveCycle(live, schedule(fresh, self.policy.policy), fresh, writes)

    def carry_out(self, writes: Sequence[Write], now: float) -> None:
        """Append the scheduler's writes, then what the job controller and the agents report when they
        carry them out at once (the simulator's model: launches, stops and resizes take no time)."""
        for write in writes:
            self.append(write.event)
        for event in (member for write in writes for member in subjects.members(write.event)):
            if isinstance(event, GangBound):
                self.append(JobStarted(job_id=event.job_id, attempt=event.attempt, at=now))
            elif isinstance(event, PreemptionRequested):
                self.append(
                    JobPreempted(
                        job_id=event.job_id,
                        attempt=event.attempt,
                        for_job=event.for_job,
                        reason=event.reason,
                        at=now,
                    )
                )
            elif isinstance(event, GangResized):
                self.append(JobResized(job_id=event.job_id, attempt=event.attempt - 1, at=now))
                self.append(JobStarted(job_id=event.job_id, attempt=event.attempt, at=now))


class Twin:
    """Runs a workload through the simulator with a twin live side compared at every core call."""

    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: Cluster,
        policy: str,
        queues: Queues | None = None,
        options: SimOptions | None = None,
    ) -> None:
        # a bind onto taken GPUs is a core bug, never a difference to tolerate
        opts = dataclasses.replace(options or SimOptions(), strict=True)
        self.live_policy = live_policy(policy, queues)
        self.sim = Simulator(
            jobs, cluster, policy, queues, opts, scheduler=self._schedule, policy_obj=self.live_policy.policy
        )
        self.jobs = {j.id: j for j in jobs}
        self.live = LiveSide(cluster, self.live_policy)
        self._suspends = any(j.suspend_at is not None for j in jobs)  # (the check below costs a pass)
        self._mirrored: dict[str, tuple[int, int]] = {}  # job -> (suspensions, resumes) appended live
        self.report = TwinReport()
        self._enc = msgspec.json.Encoder()

    def run(self) -> TwinReport:
        result = self.sim.run()
        self.report.ignored_binds = self.live.state.ignored_binds
        self.report.stale_decisions = self.live.state.stale_decisions
        self.report.rejected_sim = sorted(self.sim.rejected)
        self.report.rejected_live = sorted(
            j.job_id for j in self.live.state.jobs.values() if j.state == "rejected"
        )
        self.report.sim_summary = {
            k: result.summary[k]
            for k in ("jobs", "completed", "preemptions", "rejected")
            if k in result.summary
        }
        return self.report

    # --- the wrapped core call ---------------------------------------------------------------------

    def _schedule(self, snap: ct.Snapshot, policy: object) -> ct.Decisions:
        now = snap.now
        self._catch_up(snap)
        cycle = self.live.cycle(now)
        if cycle.snapshot is not None:
            self._compare_inputs(snap, cycle.snapshot)
        mine = schedule(snap, policy)  # type: ignore[arg-type]
        self._compare(now, mine, cycle.live, cycle.audit)
        self.live.carry_out(cycle.writes, now)
        self._count(mine)
        return mine

    def _compare_inputs(self, sim: ct.Snapshot, live: ct.Snapshot) -> None:
        a, b = canonical_inputs(sim), canonical_inputs(live)
        if a != b:
            self.report.input_mismatches.append(
                Mismatch(cycle=self.report.cycles, now=sim.now, sim=a.decode(), live=b.decode(), audit="")
            )

    def _compare(self, now: float, sim: ct.Decisions, live: ct.Decisions, audit: ct.Decisions) -> None:
        a, b, c = self._enc.encode(sim), self._enc.encode(live), self._enc.encode(audit)
        if a != b or a != c:
            self.report.mismatches.append(
                Mismatch(cycle=self.report.cycles, now=now, sim=a.decode(), live=b.decode(), audit=c.decode())
            )
        self.report.cycles += 1

    def _count(self, d: ct.Decisions) -> None:
        r = self.report
        r.binds += len(d.binds)
        r.preemptions += len(d.preemptions)
        r.resizes += len(d.resizes)
        r.reasons += len(d.pending)
        r.rejections += sum(1 for p in d.pending if p.code in NEVER_FITS)
        for reason in d.pending:
            r.codes[reason.code] = r.codes.get(reason.code, 0) + 1
        for p in d.preemptions:
            r.preemption_reasons[p.reason] = r.preemption_reasons.get(p.reason, 0) + 1

    # --- the world, as the live services report it ------------------------------------------------

    def _checkpoints(self, running: Iterable[ct.RunningJob], now: float) -> None:
        """The last checkpoint the simulator's gangs committed, as their agents report it (the fold keeps
        the newest; the ones in between change nothing the scheduler reads)."""
        jobs = self.live.state.jobs
        for rj in sorted(running, key=lambda j: j.id):
            view = jobs[rj.id]
            if rj.last_checkpoint is not None and view.last_checkpoint_at != rj.last_checkpoint:
                self.live.append(checkpoint_committed(view, rj.last_checkpoint))
                self.report.checkpoints += 1

    def _suspensions(self) -> None:
        """Suspensions and resumes since the last cycle, in arrival order."""
        jobs = self.live.state.jobs
        for sj in sorted(self.sim.jobs.values(), key=lambda sj: sj.seq):
            view = jobs.get(sj.job.id)
            if view is None or not sj.suspensions:
                continue
            done = (len(sj.suspensions), sum(back is not None for _at, back in sj.suspensions))
            mirrored = self._mirrored.get(sj.job.id, (0, 0))
            if mirrored != done:
                for event in _suspension_events(sj, view, mirrored):
                    self.live.append(event)
                self._mirrored[sj.job.id] = done

    def _catch_up(self, snap: ct.Snapshot) -> None:
        """Append what happened in the simulated world since the last cycle: nodes down or back, gangs
        that finished or lost a node, jobs submitted (in the simulator's arrival order)."""
        now = snap.now
        sim = self.sim
        state = self.live.state
        for node_id, node in sorted(sim.model.nodes.items()):
            view = state.nodes[node_id]
            if node.schedulable and view.status != "up":
                self.live.append(NodeRecovered(node_id=node_id, at=now))
            elif not node.schedulable and view.status == "up":
                self.live.append(NodeLost(node_id=node_id, reason="simulated failure", at=now))
        if self._suspends:
            self._suspensions()
        ends = {r.id: r.end for r in sim.records}
        for job in state.active_jobs():
            if job.job_id in sim.running:
                continue
            if job.job_id in ends:
                self.live.append(JobCompleted(job_id=job.job_id, attempt=job.attempt, at=ends[job.job_id]))
            elif (exited := sim.jobs[job.job_id].retry_at) is not None:
                self.live.append(service_exited(job, *exited))
            else:  # back in the simulator's queue without a preemption: a node under it failed
                self.live.append(
                    JobAttemptFailed(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        cause="infra",
                        reason="a node under the gang failed",
                        retry_at=now,
                        at=now,
                    )
                )
        self._checkpoints(sim.model.running.values(), now)
        # every job that has arrived, in arrival order: those the simulator rejected at admission too
        for sj in sorted(sim.jobs.values(), key=lambda sj: sj.seq):
            arrived = sj.job
            if arrived.submit > now:
                break
            if arrived.id not in state.jobs:
                spec = job_spec(arrived, sj.pclass)
                self.live.append(
                    JobSubmitted(
                        job_id=arrived.id, spec=spec, submitted_at=arrived.submit, submitted_by=arrived.user
                    )
                )
        # what the job controller appends for a held job whose dependency can no longer be met
        for job_id in sim.holds.failed:
            held = state.jobs[job_id]
            if not held.terminal:
                reason = never_met(held, state.jobs) or "dependency can never be met"
                self.live.append(JobFailed(job_id=job_id, attempt=held.attempt, reason=reason, at=now))
        assert all(j.state not in ACTIVE or j.job_id in sim.running for j in state.jobs.values())


def _suspension_events(sj: _SimJob, view: JobView, mirrored: tuple[int, int]) -> list[Event]:
    """What the API and the job controller appended for the simulator's suspensions and resumes of the job
    that the fold has not seen yet (``mirrored``: how many of each it has): the team's request and the stop
    at the same instant, then the resume."""
    events: list[Event] = []
    suspended, resumed = mirrored
    state = view.state
    for i, (at, back) in enumerate(sj.suspensions):
        assert at is not None
        if i >= suspended:
            attempt = view.attempt if state in ACTIVE else None
            events += [
                JobSuspendRequested(job_id=view.job_id, at=at),
                JobSuspended(job_id=view.job_id, attempt=attempt, at=at),
            ]
            state = "suspended"
        if back is not None and i >= resumed:
            events.append(JobResumed(job_id=view.job_id, at=back))
            state = "pending"
    return events


def service_exited(job: JobView, at: float, retry_at: float) -> JobAttemptFailed:
    """The job controller's answer to a service whose ranks all exited at ``at`` (``reconcile``): not
    completed, started again once the backoff is over (the simulator computed ``retry_at`` the same way)."""
    return JobAttemptFailed(
        job_id=job.job_id,
        attempt=job.attempt,
        cause="user",
        reason="every rank of the service exited; restarting it",
        exit_code=0,
        retry_at=retry_at,
        at=at,
    )


def checkpoint_committed(job: JobView, at: float) -> CheckpointCommitted:
    """The agent's report of a gang's next checkpoint, committed at ``at``."""
    step = len(job.checkpoints) + 1
    return CheckpointCommitted(
        job_id=job.job_id,
        attempt=job.attempt,
        step=step,
        path=f"ckpt/{job.job_id}/{step}",
        manifest_sha256="",
        bytes=0,
        shards=len(job.placements),
        save_s=0.0,
        node_id=job.placements[0].node_id,
        at=at,
    )


def live_policy(policy: str, queues: Queues | None) -> SchedulingPolicy:
    """The scheduler service's policy for a queue file (``load_queue_config``'s translation)."""
    if queues is None:
        return SchedulingPolicy(policy)
    core, classes = core_queues(queues)
    return SchedulingPolicy(policy, queues=core, priority_classes=classes)


def run_twin(
    jobs: Sequence[Job],
    cluster: Cluster,
    policy: str,
    queues: Queues | None = None,
    options: SimOptions | None = None,
) -> TwinReport:
    return Twin(jobs, cluster, policy, queues, options).run()
