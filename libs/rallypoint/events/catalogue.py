"""The event catalogue: every fact Rallypoint records in its log.

Events are frozen msgspec Structs with past-tense names. The tag carries the schema version
(``JobSubmitted.v1``); a breaking change adds ``.v2`` and an upcaster in ``upcast.py``, never an
in-place edit. This module imports nothing of ours: every other layer depends on it, not the reverse.

Times are seconds since the Unix epoch as floats, stamped by the writer; the pure core never reads a
clock, it reads these fields.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

TopologyLevel = Literal["nvlink", "node", "rack", "spine", "cluster"]

#: One whole GPU in the thousandths a fractional job asks for (``JobSpec.gpu_milli``).
GPU_MILLI = 1000
#: Compute slices of a MIG-capable GPU (a profile ``Ng.*`` takes N of them; ``core.mig``).
MIG_COMPUTE_SLICES = 7


class _Event(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of every event; ``type`` is the versioned tag."""


# ---------------------------------------------------------------------------------------------------
# Value objects carried inside events
# ---------------------------------------------------------------------------------------------------


#: When a dependency is met: ``after`` once the job was placed; ``after-ok`` once it completed;
#: ``after-not-ok`` once it ended any other way (failed, cancelled, rejected); ``after-any`` once it ended.
DependencyKind = Literal["after", "after-ok", "after-not-ok", "after-any"]


class Dependency(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job this one waits for, and on what (``DependencyKind``)."""

    kind: DependencyKind
    job_id: str


class ArrayMember(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job that is one member of a job array (``rally submit --array 0-99%8``): the array's id, this
    member's index (its rank sees ``RALLY_ARRAY_INDEX``), how many members the array has, and how many of
    them may hold GPUs at once (None: no limit)."""

    array_id: str
    index: int
    count: int
    max_running: int | None = None


class Affinity(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A rule between jobs of one team: the job's tasks go only to ``level`` domains (a node or a rack)
    that hold a running member of ``group`` (``anti`` False: together with them, anywhere while none
    runs), or only to domains that hold none (``anti`` True: e.g. two service replicas never in the same
    rack). A job naming a group is a member of it (``core.constraints``). Groups are per team: one
    team's rules never see another team's jobs."""

    group: str
    level: Literal["node", "rack"] = "node"
    anti: bool = False


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a user asked for. Validated by ``rallypoint.jobs.validate`` before it is ever appended.

    A gang of ``gpus`` GPUs is split into ``gpus // gpus_per_task`` tasks; each task lands on one node
    (inside one NVLink domain when it fits) and runs ``ranks_per_task`` processes, torchrun style.
    """

    name: str
    team: str
    gpus: int
    gpus_per_task: int
    ranks_per_task: int
    command: tuple[str, ...]
    priority: str = "training-standard"
    env: dict[str, str] = {}
    time_limit_s: int | None = None
    gpu_type: str | None = None
    #: several acceptable GPU types, most preferred first (a gang binds on one type); not with gpu_type
    gpu_types: tuple[str, ...] | None = None
    topology_required: TopologyLevel | None = None
    topology_preferred: TopologyLevel | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    gpu_step: int | None = None
    checkpoint_dir: str | None = None
    max_retries: int = 0
    #: the names of the job's secret variables; their values never enter the log (the ``rally-secrets``
    #: bucket holds them, ``eventlog.secretstore``), so a reader of the log learns only that they exist
    secret_names: tuple[str, ...] = ()
    #: jobs this one waits for before it may be scheduled (``state.dependencies``); each existed at submit
    depends_on: tuple[Dependency, ...] = ()
    #: waits until every earlier job of its team with its name has ended (one at a time per name and team)
    singleton: bool = False
    #: set by the API on each member of an array it expands (never in a request: the request's ``array``
    #: is the index expression, ``jobs.arrays``)
    array: ArrayMember | None = None
    #: per task (one node's share of the gang): the CPU, in millicores, and the host memory, in MiB, it
    #: needs on its node (``docs/sharing.md``); 0 asks for none and runs on whatever the node has left
    cpu_milli: int = 0
    memory_mib: int = 0
    #: a fraction of one GPU in thousandths (1-999): the job is one task of one rank on a GPU it shares
    #: with other fractional jobs (``docs/sharing.md``); None: whole GPUs
    gpu_milli: int | None = None
    #: GPU memory, in MiB, a fractional job needs on its shared GPU: its share there is the larger of
    #: ``gpu_milli`` and this memory's part of the GPU's (``TaskPlacement.milli`` records it); alone it makes
    #: the job fractional too (``docs/sharing.md``)
    gpu_memory_mib: int | None = None
    #: a MIG slice of this profile (``1g.10gb``) on a GPU in MIG mode: one task, one rank, one slice
    mig_profile: str | None = None
    #: the node labels every task's node must have (``NodeRegistered.labels``), e.g. ``{"zone": "a"}``
    node_selector: dict[str, str] = {}
    #: taints of nodes it may run on (``key=value``, or ``key`` for any value): a tainted node
    #: (``NodeRegistered.taints``) takes only jobs that tolerate every one of its taints
    tolerations: tuple[str, ...] = ()
    #: affinity and anti-affinity with other jobs of its team, by group (``Affinity``)
    affinity: tuple[Affinity, ...] = ()
    #: ``service``: runs until cancelled; restarted whenever its ranks exit, never preempted
    #: (``docs/api.md``, "Services"); ``batch``: runs to completion; ``interactive``: each rank runs on a
    #: pseudo-terminal the user reaches through the API (``rally run --pty``, docs/api.md "Terminals")
    kind: Literal["batch", "service", "interactive"] = "batch"
    #: TCP ports its rank 0 listens on that the job's team may reach through the API (a notebook's 8888:
    #: ``rally port-forward``, docs/api.md "Ports"); nothing else of a node is reachable from outside
    ports: tuple[int, ...] = ()


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    index: int
    uuid: str
    memory_mib: int
    nvlink_domain: int
    #: the GPU is in MIG mode: it runs MIG slices (``MigSlice``), never a whole-GPU or fractional job
    mig: bool = False


class MigSlice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A MIG GPU instance of ``profile`` (``1g.10gb``) beginning at memory slice ``start`` of its GPU
    (``core.mig``: which starts each profile may take)."""

    profile: str
    start: int


class TaskPlacement(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """One task of a gang: the node it runs on and the exact GPU indices it owns there; for a MIG job, the
    slice of its one GPU (``mig``)."""

    task: int
    node_id: str
    gpus: tuple[int, ...]
    mig: MigSlice | None = None
    #: a fractional job that asked for GPU memory: the thousandths of its GPU it holds there
    #: (``JobSpec.gpu_memory_mib``); absent: its ``gpu_milli``
    milli: int | None = None


def mig_milli(profile: str) -> int:
    """The part of a GPU a MIG slice counts for in quota and fair share, in thousandths: its compute
    slices of the GPU's seven (``3g.40gb`` -> 428), rounded down so that any full layout of a GPU sums to
    at most one GPU (``core.units``)."""
    compute = int(profile.split("g", 1)[0])
    return compute * GPU_MILLI // MIG_COMPUTE_SLICES


def quota_milli(spec: JobSpec, placements: tuple[TaskPlacement, ...]) -> int:
    """The GPU quota a job bound on ``placements`` holds, in thousandths of a GPU: its share, its MIG
    slice's part (``mig_milli``), else every GPU it holds (what ``core.units.running_milli`` counts)."""
    milli = share_milli(spec, placements[0] if placements else None)
    if milli is not None:
        return milli
    if spec.mig_profile is not None:
        return mig_milli(spec.mig_profile)
    return sum(len(p.gpus) for p in placements) * GPU_MILLI


def share_milli(spec: JobSpec, placement: TaskPlacement | None) -> int | None:
    """The thousandths of its GPU a fractional job holds on ``placement`` (what its Bind recorded for a
    job asking for GPU memory, else its ``gpu_milli``); None for a job that is not fractional."""
    if placement is not None and placement.milli is not None:
        return placement.milli
    return spec.gpu_milli


# ---------------------------------------------------------------------------------------------------
# Job lifecycle — rally.job.<job_id> (API), rally.queue.<job_id> (scheduler), rally.ctl.job.<job_id> (job
# controller), rally.agent.<node_id>.job.<job_id> (agents); subjects.for_event gives each event its subject
# ---------------------------------------------------------------------------------------------------


class JobSubmitted(_Event, tag="JobSubmitted.v1", frozen=True, kw_only=True):
    job_id: str
    spec: JobSpec
    submitted_at: float
    idempotency_key: str | None = None
    #: the user of the API token that submitted it (None: written before the API authenticated callers)
    submitted_by: str | None = None


class JobRejected(_Event, tag="JobRejected.v1", frozen=True, kw_only=True):
    job_id: str
    reason: str
    field: str | None = None
    at: float


class JobQueued(_Event, tag="JobQueued.v1", frozen=True, kw_only=True):
    """The scheduler accepted the job into its queue (it could ever fit this cluster)."""

    job_id: str
    queue: str
    at: float


class JobStarted(_Event, tag="JobStarted.v1", frozen=True, kw_only=True):
    """Every rank of the attempt was launched by its node agent.

    ``resume_step``: the step of the latest complete checkpoint the ranks were told to resume from
    (None: a fresh start).
    """

    job_id: str
    attempt: int
    resume_step: int | None = None
    at: float


class RankExited(_Event, tag="RankExited.v1", frozen=True, kw_only=True):
    job_id: str
    attempt: int
    rank: int
    node_id: str
    exit_code: int
    at: float


class JobCompleted(_Event, tag="JobCompleted.v1", frozen=True, kw_only=True):
    job_id: str
    attempt: int
    at: float


class JobFailed(_Event, tag="JobFailed.v1", frozen=True, kw_only=True):
    job_id: str
    attempt: int
    reason: str
    exit_code: int | None = None
    at: float


class JobPreempted(_Event, tag="JobPreempted.v1", frozen=True, kw_only=True):
    """The attempt was stopped (gracefully, checkpoint first) to free GPUs; the job waits again.

    ``lost_gpu_s``: GPUs x seconds since the attempt's last committed checkpoint (or its start), the
    work the next attempt must redo; ``checkpoint_step`` is the step it will resume from.
    """

    job_id: str
    attempt: int
    for_job: str
    reason: str
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None
    at: float


FailureCause = Literal["user", "infra"]


class JobAttemptFailed(_Event, tag="JobAttemptFailed.v1", frozen=True, kw_only=True):
    """An attempt failed and the job will run again: every GPU is released and the job waits in the
    queue at its original place, not before ``retry_at`` (exponential backoff for user failures).

    ``cause``: ``user`` (a rank exited non-zero; counts against ``max_retries``) or ``infra`` (a node
    under the gang failed and no in-place repair was possible; counts against the infrastructure cap).
    """

    job_id: str
    attempt: int
    cause: FailureCause
    reason: str
    exit_code: int | None = None
    retry_at: float
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None
    at: float


class JobInterrupted(_Event, tag="JobInterrupted.v1", frozen=True, kw_only=True):
    """A node under a running gang failed (lost, drained, agent gone): every rank was stopped, the
    failed nodes' GPUs are released and the healthy nodes keep theirs while the scheduler finds a
    replacement (``GangRepaired``) or gives up (``JobRequeued``)."""

    job_id: str
    attempt: int
    failed_nodes: tuple[str, ...]
    reason: str
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None
    at: float


class JobCancelRequested(_Event, tag="JobCancelRequested.v1", frozen=True, kw_only=True):
    job_id: str
    at: float
    requested_by: str = "user"
    #: why, when the cluster asked rather than a person: an interactive session's client gone or idle
    reason: str | None = None


class JobCancelled(_Event, tag="JobCancelled.v1", frozen=True, kw_only=True):
    job_id: str
    attempt: int | None = None
    at: float


class JobSuspendRequested(_Event, tag="JobSuspendRequested.v1", frozen=True, kw_only=True):
    """The job's team or an admin asked to suspend it (``rally suspend``): checkpoint, stop, free the GPUs."""

    job_id: str
    at: float
    requested_by: str = "user"


class JobSuspended(_Event, tag="JobSuspended.v1", frozen=True, kw_only=True):
    """The suspended job holds nothing: its attempt's ranks stopped after the grace to checkpoint (``attempt``
    None: it was waiting, nothing ran). It waits for a resume, not for the scheduler. ``lost_gpu_s`` and
    ``checkpoint_step`` as for ``JobPreempted``."""

    job_id: str
    attempt: int | None = None
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None
    at: float


class JobResumed(_Event, tag="JobResumed.v1", frozen=True, kw_only=True):
    """Its team or an admin resumed the job (``rally resume``): it waits for the scheduler again, in its
    original place, and its next attempt starts from its latest checkpoint. A resume before the job was
    suspended withdraws the request."""

    job_id: str
    at: float
    requested_by: str = "user"


# ---------------------------------------------------------------------------------------------------
# Checkpoints — rally.agent.<node_id>.ckpt.<job_id> (commits, agents), rally.ckpt.<job_id> (checkpoint svc)
# ---------------------------------------------------------------------------------------------------


class CheckpointCommitted(_Event, tag="CheckpointCommitted.v1", frozen=True, kw_only=True):
    """Every shard of every rank of ``step`` is durable and its manifest is committed.

    Reported by the training client to its node agent, which appends this. ``path`` is the step's folder
    (the manifest is ``path/manifest.json``); ``manifest_sha256`` is the digest of the manifest's bytes.
    """

    job_id: str
    attempt: int
    step: int
    path: str
    manifest_sha256: str
    bytes: int
    shards: int
    save_s: float
    node_id: str
    at: float


class CheckpointVerified(_Event, tag="CheckpointVerified.v1", frozen=True, kw_only=True):
    """The checkpoint service re-read the step's manifest and every shard: ``ok`` or why not."""

    job_id: str
    step: int
    ok: bool
    error: str = ""
    at: float


class CheckpointDeleted(_Event, tag="CheckpointDeleted.v1", frozen=True, kw_only=True):
    """Retention removed the step's files (never the newest complete checkpoint)."""

    job_id: str
    step: int
    reason: str
    at: float


# ---------------------------------------------------------------------------------------------------
# Node lifecycle — under rally.node.<node_id>.>: .agent (the node's agent: NodeRegistered), .health (the
# health monitor's verdicts and drains), .op (an operator's drain and undrain, through the API)
# ---------------------------------------------------------------------------------------------------


class NodeRegistered(_Event, tag="NodeRegistered.v1", frozen=True, kw_only=True):
    node_id: str
    address: str
    rack: str
    spine: str = "spine-0"
    gpu_type: str
    gpus: tuple[GpuInfo, ...]
    cpu_milli: int
    memory_mib: int
    agent_instance: str
    at: float
    #: the node's labels (its agent's ``--label``): a job's ``node_selector`` must match them
    labels: dict[str, str] = {}
    #: the node's taints (its agent's ``--taint``, ``key=value`` or ``key``): only jobs whose
    #: ``tolerations`` match all of them run here
    taints: tuple[str, ...] = ()


class NodeHeartbeatLost(_Event, tag="NodeHeartbeatLost.v1", frozen=True, kw_only=True):
    node_id: str
    last_seen: float
    at: float


class NodeDrained(_Event, tag="NodeDrained.v1", frozen=True, kw_only=True):
    """No new work on the node; running work keeps running. ``drained_by``: the health monitor (its
    automatic drain on a GPU fault) or the operator's user (``rally nodes drain``), who alone may undrain."""

    node_id: str
    reason: str
    at: float
    drained_by: str = "health-monitor"


class NodeLost(_Event, tag="NodeLost.v1", frozen=True, kw_only=True):
    node_id: str
    reason: str
    at: float


class NodeRecovered(_Event, tag="NodeRecovered.v1", frozen=True, kw_only=True):
    node_id: str
    at: float


class NodeUndrained(_Event, tag="NodeUndrained.v1", frozen=True, kw_only=True):
    """An operator returned a drained node to service (``rally nodes undrain``); only a drained node."""

    node_id: str
    reason: str
    undrained_by: str
    at: float


class NodeRulesSet(_Event, tag="NodeRulesSet.v1", frozen=True, kw_only=True):
    """An operator's labels and taints for a node (``rally nodes rules``), on top of what its agent
    registers (the operator's label wins over the agent's of the same key); each replaces the operator's
    previous set, and an empty one clears it. Running jobs stay: rules decide only new placements."""

    node_id: str
    labels: dict[str, str] = {}
    taints: tuple[str, ...] = ()
    set_by: str
    at: float


class HealthEvidence(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One finding behind a health verdict: ``value`` of ``signal`` on ``subject`` (``gpu 3``, ``nic ib0``,
    ``job j-1 rank 5``) against ``threshold`` over ``window_s`` (0: one sample). ``hard``: only an operator
    clears it (uncorrectable ECC, a fatal XID, repeated faults)."""

    signal: str
    subject: str
    severity: str
    value: float
    threshold: float
    window_s: float = 0.0
    hard: bool = False


NodeHealthState = Literal["healthy", "suspect", "degraded", "failed"]


class NodeHealthChanged(_Event, tag="NodeHealthChanged.v1", frozen=True, kw_only=True):
    """The health monitor's verdict on a node's signals changed (``rallypoint.health.detection``).

    ``suspect``: watched, nothing done. ``degraded`` (a soft fault): cordoned, no new work; running gangs
    have the node replaced under them as their priority class's drain policy says. ``failed`` (a hard
    fault): drained, its gangs evicted at once; only an operator's ``NodeUndrained`` returns it.
    ``healthy``: back in service after a clean probation. ``evidence``: the numbers that justify it.
    """

    node_id: str
    state: NodeHealthState
    previous: NodeHealthState
    evidence: tuple[HealthEvidence, ...] = ()
    at: float


# ---------------------------------------------------------------------------------------------------
# Scheduler decisions — single-writer subject tree rally.sched.>
# ---------------------------------------------------------------------------------------------------


class LeaderEpochStarted(_Event, tag="LeaderEpochStarted.v1", frozen=True, kw_only=True):
    """A newly elected leader fences every older one: their conditional appends now fail.

    ``role`` names the single-writer tree: ``scheduler`` (rally.sched.>) or ``preemption`` (rally.preempt.>).
    """

    epoch: int
    leader_id: str
    role: str = "scheduler"
    at: float


class SchedulerSettings(_Event, tag="SchedulerSettings.v1", frozen=True, kw_only=True):
    """What the scheduler leader of ``epoch`` decides with, recorded on its fenced tree before its first
    decision of that epoch. A scheduler's settings change only when it restarts, and a leader that starts
    (or takes over) begins a new epoch, so every decision of an epoch was computed under that epoch's
    settings: an audit replays it with them instead of assuming the defaults.

    ``policy_version`` is what the epoch's decisions record; ``policy_config`` the named policy's knobs;
    ``queues`` and ``priority_classes`` are the core's records (``rallypoint.core.types.Queue`` and
    ``PriorityClass``) as the scheduler read them from ``queue_file`` (None: it ran without one, no
    quotas); ``repair_wait_s`` its ``--repair-wait``. The folds ignore it."""

    epoch: int
    leader_id: str
    policy: str
    policy_version: str
    policy_config: dict[str, Any]
    queue_file: str | None = None
    queues: tuple[dict[str, Any], ...] = ()
    priority_classes: tuple[dict[str, Any], ...]
    repair_wait_s: float
    at: float


class GangBound(_Event, tag="GangBound.v1", frozen=True, kw_only=True):
    """The whole gang, placed at once. ``computed_at_seq`` and ``policy_version`` make it replayable."""

    job_id: str
    attempt: int
    epoch: int
    placements: tuple[TaskPlacement, ...]
    computed_at_seq: int
    policy_version: str
    now: float
    at: float


class GangsBound(_Event, tag="GangsBound.v1", frozen=True, kw_only=True):
    """Several gangs one cycle bound, as one message: each member is the ``GangBound`` the fold applies,
    in the cycle's order, as if each had been stored on its own at this event's sequence. A cycle that
    binds one gang writes its ``GangBound`` alone. Why: every event is delivered to every fold, so a
    cycle's eighteen binds in eighteen messages cost each service eighteen receives; in one, one."""

    binds: tuple[GangBound, ...]


class JobPending(_Event, tag="JobPending.v1", frozen=True, kw_only=True):
    """Why a job waits: appended when the reason code changes, and again (rate-limited) when its numbers
    do. ``now`` is the time the cycle decided at (None in logs written before it was recorded): with
    ``computed_at_seq`` and ``policy_version`` it lets an audit recompute the reason bit for bit."""

    job_id: str
    code: str
    message: str
    position: int | None = None
    epoch: int
    computed_at_seq: int
    policy_version: str = ""
    at: float
    now: float | None = None


class PreemptionRequested(_Event, tag="PreemptionRequested.v1", frozen=True, kw_only=True):
    """The scheduler asks for ``job_id``'s attempt to stop so ``for_job`` can run.

    ``reason`` is the core's: ``reclaim`` (the victim borrows quota the preemptor is guaranteed),
    ``priority`` (the preemptor ranks strictly higher) or ``las``. The job controller carries it out.

    ``role`` is the single-writer role whose epoch the request carries: ``scheduler`` since the scheduler
    writes a cycle's whole output (on ``rally.sched.preempt.<id>``); ``preemption`` (the default, so the
    field is absent from them) for the requests an older preemption service wrote on
    ``rally.preempt.request.<id>`` under its own epochs. Old logs keep folding as they were recorded.
    """

    job_id: str
    role: Literal["scheduler", "preemption"] = "preemption"
    attempt: int
    for_job: str
    reason: str
    epoch: int
    computed_at_seq: int
    policy_version: str
    now: float
    at: float


class NodeSwap(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Task ``task`` of a repaired gang moved from ``from_node`` (failed) to ``to_node``."""

    task: int
    from_node: str
    to_node: str


class GangRepaired(_Event, tag="GangRepaired.v1", frozen=True, kw_only=True):
    """An interrupted gang is whole again as ``attempt``: the healthy nodes kept their GPUs, ``swaps``
    name the replacement nodes, and ``placements`` is the whole new gang (fewer tasks when an elastic gang
    shrank to its healthy part instead, ``shrunk``)."""

    job_id: str
    attempt: int
    epoch: int
    placements: tuple[TaskPlacement, ...]
    swaps: tuple[NodeSwap, ...] = ()
    shrunk: bool = False
    computed_at_seq: int
    policy_version: str
    now: float
    at: float


class JobRequeued(_Event, tag="JobRequeued.v1", frozen=True, kw_only=True):
    """No replacement for an interrupted gang in time: its healthy nodes' GPUs are released and it waits
    again at its original queue position."""

    job_id: str
    attempt: int
    reason: str
    epoch: int
    computed_at_seq: int
    now: float
    at: float


class GangResized(_Event, tag="GangResized.v1", frozen=True, kw_only=True):
    """The scheduler resizes an elastic running gang to ``placements`` (the whole new gang, tasks 0..n-1),
    which runs as ``attempt``: a checkpoint-restart at the new size, not a change in place.

    The GPUs it adds are the gang's at once (nobody else may take them); the ones it drops stay the gang's
    until its ranks have stopped (``JobResized``), so no GPU is handed on while a rank on it runs. ``gpus``
    and ``reason`` are the core's (``shrink for <job>``, ``grow into idle GPUs``)."""

    job_id: str
    attempt: int
    epoch: int
    placements: tuple[TaskPlacement, ...]
    gpus: int
    reason: str
    computed_at_seq: int
    policy_version: str
    now: float
    at: float


class JobResized(_Event, tag="JobResized.v1", frozen=True, kw_only=True):
    """Every rank of ``attempt`` stopped (SIGTERM, a checkpoint in the grace period) for a ``GangResized``:
    the GPUs it drops are free, and the gang relaunches at its new size as the resize's attempt, resuming
    from its newest complete checkpoint. ``lost_gpu_s`` and ``checkpoint_step`` as for ``JobPreempted``."""

    job_id: str
    attempt: int
    lost_gpu_s: float = 0.0
    checkpoint_step: int | None = None
    at: float


# ---------------------------------------------------------------------------------------------------
# Service records — each role's own rally.snap.<role>
# ---------------------------------------------------------------------------------------------------


class SnapshotTaken(_Event, tag="SnapshotTaken.v1", frozen=True, kw_only=True):
    """``role`` saved its snapshot of the fold at ``seq``: the state's ``hash()`` after applying ``seq``,
    under fold version ``fold_version``. A reader restores that role's snapshot only when it matches its
    last such record; the fold itself ignores it."""

    role: str
    seq: int
    state_hash: str
    fold_version: int
    at: float


JobEvent = (
    JobSubmitted
    | JobRejected
    | JobQueued
    | JobStarted
    | RankExited
    | JobCompleted
    | JobFailed
    | JobPreempted
    | JobAttemptFailed
    | JobInterrupted
    | JobCancelRequested
    | JobCancelled
    | JobResized
    | JobSuspendRequested
    | JobSuspended
    | JobResumed
)
CheckpointEvent = CheckpointCommitted | CheckpointVerified | CheckpointDeleted
NodeEvent = (
    NodeRegistered
    | NodeHeartbeatLost
    | NodeDrained
    | NodeLost
    | NodeRecovered
    | NodeUndrained
    | NodeHealthChanged
    | NodeRulesSet
)
SchedulerEvent = (
    LeaderEpochStarted
    | SchedulerSettings
    | GangBound
    | GangsBound
    | JobPending
    | PreemptionRequested
    | GangRepaired
    | JobRequeued
    | GangResized
)
Event = JobEvent | CheckpointEvent | NodeEvent | SchedulerEvent | SnapshotTaken

ALL_EVENT_TYPES: tuple[type[_Event], ...] = (
    JobSubmitted,
    JobRejected,
    JobQueued,
    JobStarted,
    RankExited,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobAttemptFailed,
    JobInterrupted,
    JobCancelRequested,
    JobCancelled,
    CheckpointCommitted,
    CheckpointVerified,
    CheckpointDeleted,
    NodeRegistered,
    NodeHeartbeatLost,
    NodeDrained,
    NodeLost,
    NodeRecovered,
    NodeUndrained,
    NodeHealthChanged,
    LeaderEpochStarted,
    SchedulerSettings,
    GangBound,
    GangsBound,
    JobPending,
    PreemptionRequested,
    GangRepaired,
    JobRequeued,
    GangResized,
    JobResized,
    SnapshotTaken,
    JobSuspendRequested,
    JobSuspended,
    JobResumed,
    NodeRulesSet,
)
