"""Snapshot and decision types of the pure scheduling core.

Everything here is a frozen msgspec Struct except :class:`~rallypoint.core.cluster.ClusterModel`, the one
mutable-by-the-caller piece: it keeps the free-GPU bookkeeping (per node, rack, spine, GPU type, queue usage)
incrementally so that building a snapshot at every event instant costs O(change), not O(cluster).
``schedule()`` only *reads* the model; it works on a copy-on-write overlay and never mutates it.

Names in this module are a contract (the simulator, the scheduler service and the audit tool build these
types): extend with new optional fields, never rename.

Times are seconds (floats) on whatever clock the caller uses (Unix epoch in the services, trace time in the
simulator). The core never reads a clock: ``Snapshot.now`` is the only "now".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from rallypoint.core.formulas import runtime_estimate
from rallypoint.events.catalogue import Affinity, TaskPlacement, TopologyLevel
from rallypoint.userusage import UserUsage

if TYPE_CHECKING:
    from rallypoint.core.cluster import ClusterModel

__all__ = [
    "CPU",
    "DEFAULT_PRIORITY_CLASSES",
    "MEMORY",
    "SERVICE",
    "Affinity",
    "Bind",
    "Decisions",
    "Node",
    "PendingJob",
    "PendingReason",
    "Preemption",
    "PriorityClass",
    "Queue",
    "Quota",
    "ReasonCode",
    "Reservation",
    "Resize",
    "RunningJob",
    "Snapshot",
    "TaskPlacement",
    "TopologyLevel",
]

# ---------------------------------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------------------------------


class Node(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One machine. Topology is cluster > spine > rack > node > NVLink domain > GPU.

    ``nvlink_domains`` groups GPU indices that share an NVLink/NVSwitch domain; empty means one domain
    holding every GPU (the usual 8-GPU HGX board). ``schedulable`` is False for drained, lost or
    unhealthy nodes: they keep their running jobs (the caller unbinds those) but receive no new work.
    """

    id: str
    rack: str
    spine: str = "spine-0"
    gpu_type: str = "default"
    gpus: int = 8
    nvlink_domains: tuple[tuple[int, ...], ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    schedulable: bool = True
    #: GPUs in MIG mode: they hold MIG slices only (``core.sharing``), never whole or fractional jobs
    mig_gpus: tuple[int, ...] = ()
    #: the node's labels as (key, value) pairs, sorted: a job's ``node_selector`` must find all of its own
    labels: tuple[tuple[str, str], ...] = ()
    #: the node's taints (``key=value`` or ``key``), sorted: only a job that tolerates every one of them
    #: (``PendingJob.tolerations``) runs here; the index counts a tainted node as unschedulable for all
    #: other jobs (``core.constraints``)
    taints: tuple[str, ...] = ()
    #: memory of each of its GPUs, in MiB (0: unknown; a job asking for GPU memory never shares it)
    gpu_memory_mib: int = 0


# ---------------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------------


class RunningJob(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A gang that holds GPUs. Registered with ``ClusterModel.bind(job)``.

    ``expected_end`` is start + time limit, or start + a runtime learned from history; None means unknown
    (such a job never frees GPUs in reservation arithmetic). ``attained_gpu_s`` is the GPU-seconds of
    service attained *before* ``start_time`` (earlier runs); the core adds ``gpus * (now - start_time)``.
    ``last_preempted_at`` protects a job preempted recently (``PolicyConfig.preemption_protection_s``).

    ``preempting_for`` is set by the caller on a victim it has asked to stop (a ``Preemption`` decision)
    while the victim still holds its GPUs: the id of the job it is being preempted for. Such a job is never
    chosen as a victim again, never counted as releasing GPUs to anyone else, and the GPUs of the
    preemptor's slot that are already free are held for the preemptor alone until it binds (a stateless
    rule: the scheduler needs no memory of earlier cycles). Unbind the victim once it has stopped.
    """

    id: str
    team: str
    queue: str | None = None  # defaults to ``team``
    priority_class: str = "training-standard"
    gpus: int
    gpu_type: str | None = None
    placements: tuple[TaskPlacement, ...]
    start_time: float
    expected_end: float | None = None
    last_checkpoint: float | None = None
    preemptible: bool = True
    min_gpus: int | None = None
    max_gpus: int | None = None
    gpu_step: int | None = None
    gpus_per_task: int | None = None
    attained_gpu_s: float = 0.0
    last_preempted_at: float | None = None
    cpu_milli: int = 0  # per task, on its node
    memory_mib: int = 0  # per task, on its node
    submit_time: float | None = None
    preempting_for: str | None = None
    gpu_milli: int | None = None  # a fractional job's share of its one GPU (``PendingJob.gpu_milli``)
    #: the affinity groups the job is a member of (``Affinity.group``; ``core.constraints``)
    affinity_groups: tuple[str, ...] = ()
    mig_profile: str | None = None  # a MIG job's profile; its slice is in ``placements[0].mig``
    service: bool = False  # ``kind: service``: counts against its queue's ``Queue.service_gpus``

    @property
    def queue_name(self) -> str:
        return self.queue if self.queue is not None else self.team


class PendingJob(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A gang waiting for GPUs: ``gpus`` total, in ``gpus // gpus_per_task`` tasks of one node each.

    ``arrival`` breaks ties between equal submit times (the caller's monotonic submission counter).
    ``expected_runtime_s`` is a runtime learned from the same user's and job name's history; backfill
    uses it before ``time_limit_s``. Elastic gangs set ``min_gpus``/``max_gpus``/``gpu_step``; ``gpus`` is
    then the preferred size (usually max).

    ``gpu_type`` names the one GPU model the job needs (None: any). ``gpu_types`` instead lists several
    allowed models in the job's order of preference (the openb "V100M16|V100M32"): the whole gang binds on
    one of them, the first in that order where it fits now; types the cluster lacks are ignored. Set at
    most one of the two (a job with both, or with an empty ``gpu_types``, waits with code ``Invalid``).

    ``cpu_milli`` and ``memory_mib`` are per task: each task's node must have that much CPU and memory left
    (``Node.cpu_milli`` / ``memory_mib`` less its running tasks'). ``gpu_milli`` (1-999) makes the job a
    fractional one: ``gpus`` is 1 and its one task takes that share of one GPU, which other fractional jobs
    may share (``core.sharing``). ``mig_profile`` makes it a MIG job: one task on a slice of that profile of
    a GPU in MIG mode (``Node.mig_gpus``).
    """

    id: str
    team: str
    queue: str | None = None  # defaults to ``team``
    priority_class: str = "training-standard"
    gpus: int
    gpus_per_task: int = 8
    submit_time: float
    arrival: int = 0
    time_limit_s: float | None = None
    expected_runtime_s: float | None = None
    gpu_type: str | None = None
    gpu_types: tuple[str, ...] | None = None
    topology_required: TopologyLevel | None = None
    topology_preferred: TopologyLevel | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    gpu_step: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    attained_gpu_s: float = 0.0
    last_preempted_at: float | None = None
    last_run_s: float = 0.0
    user: str | None = None
    name: str | None = None
    gpu_milli: int | None = None
    mig_profile: str | None = None
    #: GPU memory a fractional job needs on its GPU (``JobSpec.gpu_memory_mib``; ``core.sharing.need_on``)
    gpu_memory_mib: int | None = None
    node_selector: tuple[tuple[str, str], ...] = ()  # labels every task's node must have, sorted
    service: bool = False  # ``kind: service``: admitted only within its queue's ``Queue.service_gpus``
    tolerations: tuple[str, ...] = ()  # taints (``key=value``, or ``key`` for any value) it may run on
    affinity: tuple[Affinity, ...] = ()  # rules between it and other jobs of its team (``Affinity``)

    @property
    def queue_name(self) -> str:
        return self.queue if self.queue is not None else self.team

    @property
    def runtime_estimate(self) -> float | None:
        """Learned runtime when known, else the time limit, else unknown (``formulas.runtime_estimate``)."""
        return runtime_estimate(self)


# ---------------------------------------------------------------------------------------------------
# Queues, quotas, priority classes
# ---------------------------------------------------------------------------------------------------


#: Quota keys of the resources beside GPUs: a ``Quota`` with one of these as its ``gpu_type`` counts
#: millicores of CPU or MiB of memory (every task's), and a ``"*"`` quota never applies to them.
CPU = "resource:cpu"
MEMORY = "resource:memory"
#: The usage key of the GPUs a queue's services hold (``Queue.service_gpus``); never a ``Quota`` key.
SERVICE = "resource:service-gpus"


class Quota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-GPU-type quota of a queue (Kueue ClusterQueue resource group semantics).

    ``nominal`` is guaranteed; ``borrowing_limit`` caps what the queue may use above nominal from idle
    cohort quota (None = unlimited); ``lending_limit`` caps how much of its unused nominal others may
    borrow (None = all of it). ``gpu_type`` "*" applies to every type without its own entry.
    """

    gpu_type: str = "*"
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


class Queue(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A queue: an org (``parent`` None) or a team under an org. Jobs name team queues.

    Queues in the same ``cohort`` share idle quota; a team's cohort defaults to its parent org.
    A parent's quotas cap the sum of its children. ``weight`` scales DRF fair share (higher = bigger share).
    ``user_weights`` scales the fair share of the team's users (``userusage``; unlisted users weigh 1).
    """

    name: str
    parent: str | None = None
    cohort: str | None = None
    weight: float = 1.0
    quotas: tuple[Quota, ...] = ()
    user_weights: tuple[tuple[str, float], ...] = ()
    #: GPUs reserved for the queue's services (``kind: service``): its services hold at most this many
    #: together, and a service beyond it waits (``QuotaExceeded``, "service capacity"). None: no cap.
    service_gpus: int | None = None


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass(name="production", value=1000, preemptible=False),
    PriorityClass(name="training-high", value=800),
    # interactive sessions (``kind: interactive``, the only jobs that may use it): ahead of standard
    # training, so a shell starts in seconds, and never stopped for training once it runs
    PriorityClass(name="interactive", value=600, preemptible=False),
    PriorityClass(name="training-standard", value=500),
    PriorityClass(name="development", value=200),
    PriorityClass(name="best-effort", value=0),
)


# ---------------------------------------------------------------------------------------------------
# Snapshot
# ---------------------------------------------------------------------------------------------------


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one decision depends on.

    ``cluster`` holds the nodes, free GPUs and the running jobs (``cluster.running``). ``pending`` may be
    in any order: the policy orders it. No queues configured means no quota enforcement; a job naming an
    unknown queue is unlimited too (so a trace without quotas replays). Unknown priority class names get
    value 0. ``user_usage`` holds the usage of the users with pending jobs (``userusage``: fair share
    between a team's users); a user without a row has used nothing.
    """

    now: float
    cluster: ClusterModel
    pending: tuple[PendingJob, ...] = ()
    queues: tuple[Queue, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    user_usage: tuple[UserUsage, ...] = ()


# ---------------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------------

ReasonCode = Literal[
    "Resources",  # not enough free GPUs of the right type / shape now
    "Priority",  # waits behind higher-ranked jobs (or FIFO head-of-line blocking)
    "QuotaExceeded",  # its queue is at nominal + borrowing limit, or the cohort has nothing to lend
    "Topology",  # enough GPUs in total, but not inside the required level (rack / spine / node)
    "Reservation",  # fits now, but would delay a reserved head job (EASY backfill refused)
    "NodeUnhealthy",  # would fit if unhealthy / drained nodes were back
    "GangTooLarge",  # can never fit this cluster (or the required level) even when empty
    "Invalid",  # malformed request that no cluster state can satisfy (e.g. both gpu_type and gpu_types)
    "Preempting",  # victims were asked to stop; binds once they have released their GPUs
    "Reserved",  # this job holds the reservation; earliest start given
]


class Bind(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Place the whole gang now, on exactly these GPUs."""

    job_id: str
    gpus: int
    placements: tuple[TaskPlacement, ...]


class Reservation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The earliest slot of a blocked head job; backfill never delays it."""

    job_id: str
    start_estimate: float | None
    nodes: tuple[str, ...]


class Preemption(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask a running job to checkpoint and stop. ``reason``: "reclaim" (its queue borrows quota that the
    preemptor is guaranteed), "priority" (the preemptor ranks strictly higher) or "las" (least attained
    service)."""

    victim_id: str
    reason: str
    for_job: str


class Resize(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Change an elastic running gang to ``gpus`` total: ``add`` new tasks or ``remove`` existing ones."""

    job_id: str
    gpus: int
    add: tuple[TaskPlacement, ...] = ()
    remove: tuple[TaskPlacement, ...] = ()
    reason: str = ""


class PendingReason(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why a job still waits: code, a message with numbers, its 0-based position in the policy's order
    among waiting jobs, and the earliest start when a reservation computed one."""

    job_id: str
    code: str
    message: str
    position: int
    earliest_start: float | None = None


class Decisions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The output of one cycle. Every pending job is either bound or has exactly one PendingReason.

    Lists are in decision order (binds in the order they were made), which is deterministic.
    """

    policy: str
    now: float
    binds: tuple[Bind, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    resizes: tuple[Resize, ...] = ()
    pending: tuple[PendingReason, ...] = ()
