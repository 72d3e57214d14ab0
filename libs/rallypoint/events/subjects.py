"""Subject naming: one subject per aggregate, so per-aggregate optimistic concurrency works.

Everything in the log lives under ``rally.`` (the stream's only subject filter). Heartbeats, agent
commands and queries use other prefixes on purpose: they are not facts and never enter the log.

Each subject branch has exactly one writer, so that NATS permissions (``rallypoint.security``) decide who may
write which event: the API writes ``rally.job.<id>`` and an operator's ``rally.node.<id>.op``, the
scheduler ``rally.sched.>`` and ``rally.queue.<id>``, the job controller ``rally.ctl.job.<id>``, the health
monitor ``rally.node.<id>.health``, a node's own agent ``rally.node.<its node>.agent`` (its registration) and
``rally.agent.<its node>.>``, the checkpoint service ``rally.ckpt.<id>``, each role that keeps a snapshot
its ``SnapshotTaken`` records on ``rally.snap.<role>``. Every fact about a node lives under
``rally.node.<id>.>`` (``NODES``), so one filter reads them all and a writer can condition on all of them.
``rally.preempt.>`` holds the preemption requests (and epochs) an older preemption service wrote before the
scheduler wrote every decision; nobody writes there any more. ``for_event`` gives the one subject an event may
be stored on; the codec quarantines an event found anywhere else (``admissible``), so a write that slipped
past the permissions still cannot change any fold.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from . import catalogue as ev

STREAM_SUBJECTS = "rally.>"
JOBS = "rally.job.>"
NODES = "rally.node.>"
SCHEDULER_TREE = "rally.sched.>"
EPOCH = "rally.sched.epoch"
#: The scheduler leader's settings (``SchedulerSettings``), recorded once per epoch on its fenced tree.
SCHEDULER_SETTINGS = "rally.sched.settings"
# Legacy: the preemption service's own fenced tree, read in old logs only (see ``preempt``).
PREEMPTION_TREE = "rally.preempt.>"
PREEMPTION_EPOCH = "rally.preempt.epoch"

# Ids become subject tokens: no dots, wildcards or whitespace.
TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _token(value: str) -> str:
    if not TOKEN_PATTERN.match(value):
        raise ValueError(f"not a valid subject token: {value!r}")
    return value


def job(job_id: str) -> str:
    """The API's subject for a job: JobSubmitted, JobCancelRequested, JobSuspendRequested, JobResumed."""
    return f"rally.job.{_token(job_id)}"


def job_control(job_id: str) -> str:
    """The job controller's subject for a job: starts, attempts, ends (never the API's to write)."""
    return f"rally.ctl.job.{_token(job_id)}"


def admission(job_id: str) -> str:
    """The scheduler's JobQueued / JobRejected: outside the fenced tree (``bridge.admission_writes``)."""
    return f"rally.queue.{_token(job_id)}"


CHECKPOINTS = "rally.ckpt.>"


def checkpoint(job_id: str) -> str:
    """The checkpoint service's verifications and deletions of a job's checkpoints."""
    return f"rally.ckpt.{_token(job_id)}"


def agent_tree(node_id: str) -> str:
    """Everything a node agent writes besides NodeRegistered: NATS lets only that node's user write here."""
    return f"rally.agent.{_token(node_id)}.>"


def agent_job(node_id: str, job_id: str) -> str:
    """A node agent's RankExited for a job's ranks on that node."""
    return f"rally.agent.{_token(node_id)}.job.{_token(job_id)}"


def agent_checkpoint(node_id: str, job_id: str) -> str:
    """A node agent's CheckpointCommitted for a job whose rank 0 runs on that node."""
    return f"rally.agent.{_token(node_id)}.ckpt.{_token(job_id)}"


#: Every checkpoint event: the agents' commits and the checkpoint service's verifications and deletions.
CHECKPOINT_FILTERS = (CHECKPOINTS, "rally.agent.*.ckpt.*")


def node_health(node_id: str) -> str:
    """The health monitor's verdicts on a node: silence, loss, recovery, signals, its automatic drains."""
    return f"rally.node.{_token(node_id)}.health"


def node_operator(node_id: str) -> str:
    """An operator's drain and undrain of a node, written by the API for an admin token."""
    return f"rally.node.{_token(node_id)}.op"


def node_registration(node_id: str) -> str:
    """A node agent's NodeRegistered: only that node's own agent user may write here."""
    return f"rally.node.{_token(node_id)}.agent"


def node_facts(node_id: str) -> str:
    """Every fact about one node, whoever wrote it: what a writer conditions on to see all of them."""
    return f"rally.node.{_token(node_id)}.>"


def bind(job_id: str) -> str:
    return f"rally.sched.bind.{_token(job_id)}"


#: A cycle's binds of several gangs as one message (``GangsBound``), on the fenced tree.
BINDS = "rally.sched.binds"


_Stored = TypeVar("_Stored")


def members(event: _Stored) -> tuple[_Stored | ev.GangBound, ...]:
    """The events ``event`` stands for: a ``GangsBound``'s binds, or the event itself. Whoever reads the
    log event by event (a fold, a job's history, a count of binds) reads what this gives."""
    return event.binds if isinstance(event, ev.GangsBound) else (event,)


def repair(job_id: str) -> str:
    """Repairs and requeues of an interrupted gang: scheduler decisions, on the fenced tree."""
    return f"rally.sched.repair.{_token(job_id)}"


def resize(job_id: str) -> str:
    """Resizes of an elastic running gang: scheduler decisions, on the fenced tree."""
    return f"rally.sched.resize.{_token(job_id)}"


def pending(job_id: str) -> str:
    return f"rally.sched.pending.{_token(job_id)}"


def preempt(job_id: str) -> str:
    """A preemption request: a scheduler decision, on the fenced tree."""
    return f"rally.sched.preempt.{_token(job_id)}"


def legacy_preempt(job_id: str) -> str:
    """Where an older preemption service wrote its requests (``PreemptionRequested.role == "preemption"``)."""
    return f"rally.preempt.request.{_token(job_id)}"


#: Single-writer role -> the subject its new leaders append LeaderEpochStarted to.
EPOCH_SUBJECTS = {"scheduler": EPOCH, "preemption": PREEMPTION_EPOCH}

#: The job controller's partitions. A job, and a node for the controller's sweeps, belongs to one of them for
#: good (``partition_of``); each partition has one owner at a time, whose every write is fenced on the
#: partition's epoch subject (``control_epoch``). Fixed: changing it would move jobs between partitions.
CONTROL_PARTITIONS = 32
CONTROL_ROLE = "job-controller"


def partition_of(key: str, count: int) -> int:
    """The partition of ``key`` among ``count``: stable across processes and releases (not ``hash()``)."""
    return zlib.crc32(key.encode()) % count


def partition_role(service: str, partition: int) -> str:
    """The single-writer role of one partition (``LeaderEpochStarted.role``): ``job-controller.7``."""
    return f"{service}.{partition}"


def control_epoch(partition: int) -> str:
    """Where a new owner of a job-controller partition appends its LeaderEpochStarted."""
    return f"rally.ctl.epoch.{partition}"


#: The health monitor's partitions: the nodes, by the same hash and count as the job controller's sweeps,
#: so a node's partition number is the same for both services (their owners and fences are not).
HEALTH_PARTITIONS = CONTROL_PARTITIONS
HEALTH_ROLE = "health-monitor"


def health_epoch(partition: int) -> str:
    """Where a new owner of a health-monitor partition appends its LeaderEpochStarted. Under ``NODES``, so
    the monitor's fold (which reads the nodes' subjects alone) sees its epochs; five tokens, where every
    node's own subject has four (``rally.node.<id>.<kind>``), so no node id can name it."""
    return f"rally.node.partition.{partition}.epoch"


#: The checkpoint service's partitions: the jobs, by the job controller's hash and count, so a job's
#: partition number is the same for both services (their owners and fences are not).
CHECKPOINT_PARTITIONS = CONTROL_PARTITIONS
CHECKPOINT_ROLE = "checkpoint"


def checkpoint_epoch(partition: int) -> str:
    """Where a new owner of a checkpoint partition appends its LeaderEpochStarted. Under ``CHECKPOINTS``,
    beside the verifications it fences (the service's fold reads the whole log); four tokens, where every
    job's own subject there has three (``rally.ckpt.<id>``), so no job id can name it."""
    return f"rally.ckpt.epoch.{partition}"


#: Partitioned role -> (its partition count, its partitions' epoch subjects).
_PARTITIONED: dict[str, tuple[int, Callable[[int], str]]] = {
    CONTROL_ROLE: (CONTROL_PARTITIONS, control_epoch),
    HEALTH_ROLE: (HEALTH_PARTITIONS, health_epoch),
    CHECKPOINT_ROLE: (CHECKPOINT_PARTITIONS, checkpoint_epoch),
}


def _partition_epoch(role: str) -> str | None:
    service, _, number = role.rpartition(".")
    # one spelling per partition: no sign, no leading zero, no other digits than 0-9
    if (
        service not in _PARTITIONED
        or not (number.isascii() and number.isdigit())
        or number != str(int(number))
    ):
        return None
    count, subject = _PARTITIONED[service]
    if int(number) >= count:
        return None
    return subject(int(number))


def epoch(role: str) -> str:
    if role in EPOCH_SUBJECTS:
        return EPOCH_SUBJECTS[role]
    subject = _partition_epoch(role)
    if subject is None:
        raise ValueError(f"no single-writer role {role!r}")
    return subject


def snapshot_taken(role: str) -> str:
    """Where ``role`` records each snapshot it saves (``SnapshotTaken``): only that role may write here."""
    return f"rally.snap.{_token(role)}"


def heartbeat(node_id: str) -> str:
    return f"hb.{_token(node_id)}"


HEARTBEATS = "hb.*"


def agent_command(node_id: str, verb: str) -> str:
    """Request/reply subject of a node agent (``launch``, ``kill``, ``status``)."""
    return f"cmd.agent.{_token(node_id)}.{_token(verb)}"


def agent_commands(node_id: str) -> str:
    """Every verb's ``agent_command`` subject of one node (a wildcard: what a process serving many
    simulated nodes subscribes to, once per node)."""
    return f"cmd.agent.{_token(node_id)}.*"


def terminal_input(node_id: str, session: str) -> str:
    """Where the API sends an interactive session's keystrokes, resizes and keepalives (core NATS): a
    command to the rank's agent, which alone subscribes to its ``cmd.agent.<node>.>``."""
    return f"{agent_command(node_id, 'tty')}.{_token(session)}"


def terminal_output(node_id: str, session: str) -> str:
    """Where a node's agent sends an interactive session's output and end (core NATS); only that agent
    may publish under ``tty.<node>.>``, only the API subscribes."""
    return f"tty.{_token(node_id)}.{_token(session)}"


def terminal_tree(node_id: str) -> str:
    """Every session's output of one node's agent: what that agent alone may publish."""
    return f"tty.{_token(node_id)}.*"


TERMINALS = "tty.*.*"


def query(service: str, what: str) -> str:
    return f"q.{_token(service)}.{_token(what)}"


# --- where each event belongs ------------------------------------------------------------------

_JOB_CONTROL = (
    ev.JobStarted,
    ev.JobCompleted,
    ev.JobFailed,
    ev.JobPreempted,
    ev.JobAttemptFailed,
    ev.JobInterrupted,
    ev.JobCancelled,
    ev.JobResized,
    ev.JobSuspended,
)
_NODE_VERDICTS = (
    ev.NodeHeartbeatLost,
    ev.NodeLost,
    ev.NodeRecovered,
    ev.NodeHealthChanged,
)
#: Who ``NodeDrained.drained_by`` names when the health monitor drained a node; anyone else is an operator.
HEALTH_MONITOR = "health-monitor"


def _drained(e: ev.NodeDrained) -> str:
    return (node_health if e.drained_by == HEALTH_MONITOR else node_operator)(e.node_id)


_SUBJECT_OF: dict[type, Callable[[Any], str]] = {
    ev.JobSubmitted: lambda e: job(e.job_id),
    ev.JobCancelRequested: lambda e: job(e.job_id),
    ev.JobSuspendRequested: lambda e: job(e.job_id),
    ev.JobResumed: lambda e: job(e.job_id),
    ev.JobQueued: lambda e: admission(e.job_id),
    ev.JobRejected: lambda e: admission(e.job_id),
    **{t: (lambda e: job_control(e.job_id)) for t in _JOB_CONTROL},
    ev.RankExited: lambda e: agent_job(e.node_id, e.job_id),
    ev.CheckpointCommitted: lambda e: agent_checkpoint(e.node_id, e.job_id),
    ev.CheckpointVerified: lambda e: checkpoint(e.job_id),
    ev.CheckpointDeleted: lambda e: checkpoint(e.job_id),
    ev.NodeRegistered: lambda e: node_registration(e.node_id),
    **{t: (lambda e: node_health(e.node_id)) for t in _NODE_VERDICTS},
    ev.NodeDrained: _drained,
    ev.NodeUndrained: lambda e: node_operator(e.node_id),
    ev.NodeRulesSet: lambda e: node_operator(e.node_id),
    ev.LeaderEpochStarted: lambda e: epoch(e.role),
    ev.SchedulerSettings: lambda e: SCHEDULER_SETTINGS,
    ev.GangBound: lambda e: bind(e.job_id),
    ev.GangsBound: lambda e: BINDS,
    ev.JobPending: lambda e: pending(e.job_id),
    ev.GangRepaired: lambda e: repair(e.job_id),
    ev.JobRequeued: lambda e: repair(e.job_id),
    ev.GangResized: lambda e: resize(e.job_id),
    ev.PreemptionRequested: lambda e: (preempt if e.role == "scheduler" else legacy_preempt)(e.job_id),
    ev.SnapshotTaken: lambda e: snapshot_taken(e.role),
}


def for_event(event: ev.Event) -> str:
    """The one subject ``event`` may be stored on (ValueError when its ids cannot form one).

    It names the aggregate and, for what a node agent reports, the agent's node: so the writer's NATS
    permissions decide whether it may speak for that job or node at all.
    """
    return _SUBJECT_OF[type(event)](event)


def admissible(subject: str, event: ev.Event) -> bool:
    """True when ``event`` is stored where its type and ids say it belongs."""
    try:
        return subject == for_event(event)
    except ValueError:
        return False
