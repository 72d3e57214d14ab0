"""What a failed attempt means, and what the log records about it. Pure.

Torchrun's restarts, Slurm's requeue and Kubernetes' Job backoff in one place: a failure is classified
from the fold (infrastructure or user), then turned into the one event that says what happens next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from rallypoint.events import Event, FailureCause, JobAttemptFailed, JobFailed, JobInterrupted
from rallypoint.protocol import (
    REFUSED_BAD_REQUEST,
    REFUSED_EMPTY_COMMAND,
    REFUSED_UNKNOWN_GPUS,
    REFUSED_WRONG_NODE,
)
from rallypoint.state import ClusterState, JobView, NodeView
from rallypoint.state.cluster import describe_evidence

from .drain import DEFAULT_DRAIN_POLICY, DrainPolicy, eviction_at

#: The exit code an agent records for a rank whose wrapper vanished (``rallypoint.agent.workdir.EXIT_LOST``):
#: the outcome is unknown, so it is the infrastructure's failure, not the user's.
RANK_LOST = -1
#: The exit code the local cluster records for ranks still running when it is stopped
#: (``rallypoint.agent.workdir.EXIT_CLUSTER_STOPPED``): the infrastructure's doing too.
RANK_CLUSTER_STOPPED = -2


class RecoveryConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How the job controller recovers failed attempts.

    ``retry_backoff_s`` doubles with every user failure (10, 20, 40 s ...) up to ``max_backoff_s``;
    ``max_infra_retries`` bounds how often one job may be interrupted by the infrastructure, so a job
    that kills its nodes cannot loop forever; ``failure_grace_s`` is the SIGTERM -> SIGKILL time of the
    surviving ranks of a failed attempt; ``checkpoint_root`` holds one folder per job (a shared
    filesystem in production) unless the job names its own ``checkpoint_dir``.
    """

    checkpoint_root: str | None = None
    retry_backoff_s: float = 10.0
    max_backoff_s: float = 300.0
    max_infra_retries: int = 10
    failure_grace_s: float = 5.0
    #: What running gangs do when a node under them is drained or cordoned (``rallypoint.control.drain``).
    drain: DrainPolicy = DEFAULT_DRAIN_POLICY


class UserFailure(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    exit_code: int


class InfraFailure(msgspec.Struct, frozen=True, kw_only=True):
    failed_nodes: tuple[str, ...]
    reason: str


Failure = UserFailure | InfraFailure


def _node_of_rank(job: JobView, rank: int) -> str | None:
    task = rank // job.spec.ranks_per_task
    for placement in job.placements:
        if placement.task == task:
            return placement.node_id
    return None


def _failed_nodes(job: JobView, state: ClusterState, now: float, drain: DrainPolicy) -> list[tuple[str, str]]:
    """(node, why) for each node under the gang that can no longer run it, in node order: lost, or out of
    service (drained, cordoned) with the gang's eviction due under ``drain``."""
    out: list[tuple[str, str]] = []
    for node_id in sorted({p.node_id for p in job.placements}):
        node = state.nodes.get(node_id)
        if node is None:
            out.append((node_id, f"node {node_id} is unknown"))
        elif node.status == "lost":
            out.append((node_id, f"node {node_id} was lost ({node.status_reason})"))
        elif (due := eviction_at(job, node, drain)) is not None and due <= now:
            out.append((node_id, _out_of_service_reason(node_id, node)))
    return out


def _out_of_service_reason(node_id: str, node: NodeView) -> str:
    if node.status == "drained":
        return f"node {node_id} was drained ({node.status_reason})"
    return f"node {node_id} was cordoned: {node.health} ({describe_evidence(node.health_evidence)})"


def eviction_wake_at(job: JobView, state: ClusterState, drain: DrainPolicy) -> float | None:
    """The earliest time an out-of-service node under ``job`` becomes due for eviction (None: none)."""
    times = [
        due
        for node_id in {p.node_id for p in job.placements}
        if (node := state.nodes.get(node_id)) is not None
        and (due := eviction_at(job, node, drain)) is not None
    ]
    return min(times, default=None)


def classify_failure(
    job: JobView, state: ClusterState, now: float = float("inf"), drain: DrainPolicy = DEFAULT_DRAIN_POLICY
) -> Failure | Literal["wait"] | None:
    """The failure of ``job``'s current attempt at ``now``, ``"wait"`` while it cannot be told yet, or
    None. A gang on an out-of-service node fails when ``drain`` says it must leave the node."""
    bad = _failed_nodes(job, state, now, drain)
    if bad:
        return InfraFailure(failed_nodes=tuple(n for n, _ in bad), reason="; ".join(why for _, why in bad))
    stopped = sorted(rank for rank, code in job.ranks_exited.items() if code == RANK_CLUSTER_STOPPED)
    if stopped:
        where = _node_of_rank(job, stopped[0])
        reason = f"the cluster was stopped (rally up interrupted) while rank {stopped[0]} ran on node {where}"
        return InfraFailure(failed_nodes=(), reason=reason)
    lost = sorted(rank for rank, code in job.ranks_exited.items() if code == RANK_LOST)
    if lost:
        where = _node_of_rank(job, lost[0])
        return InfraFailure(failed_nodes=(), reason=f"rank {lost[0]} was lost with its agent on node {where}")
    failures = sorted((rank, code) for rank, code in job.ranks_exited.items() if code != 0)
    if not failures:
        return None
    if any(state.nodes[n].status != "up" for n in {p.node_id for p in job.placements} if n in state.nodes):
        # A rank dies when a peer's node does (the collective times out): the silent node is the likely
        # cause. Judge once the health monitor has called it lost or it answers again.
        return "wait"
    rank, code = failures[0]
    return UserFailure(rank=rank, exit_code=code)


def backoff_s(failures_so_far: int, config: RecoveryConfig) -> float:
    return float(min(config.max_backoff_s, config.retry_backoff_s * 2**failures_so_far))


def failure_events(
    job: JobView, failure: Failure, now: float, config: RecoveryConfig
) -> tuple[Event, tuple[str, ...]]:
    """The event that records ``failure`` (appended once the surviving ranks stopped), and the nodes that
    failed (the others keep the gang's GPUs)."""
    if isinstance(failure, InfraFailure):
        return _infra_event(job, failure, now, config), failure.failed_nodes
    return _user_event(job, failure, now, config), ()


def _infra_event(job: JobView, failure: InfraFailure, now: float, config: RecoveryConfig) -> Event:
    if job.infra_failures >= config.max_infra_retries and job.spec.kind == "service":
        # a service runs until cancelled, through any number of drains and lost nodes in its life; past
        # the cap it waits out the retry backoff first, so one that keeps breaking its nodes cannot spin
        past = job.infra_failures - config.max_infra_retries
        reason = f"{failure.reason}; {job.infra_failures} earlier infrastructure failures: after the backoff"
        return JobAttemptFailed(
            job_id=job.job_id,
            attempt=job.attempt,
            cause="infra",
            reason=reason,
            retry_at=now + backoff_s(past, config),
            at=now,
        )
    if job.infra_failures >= config.max_infra_retries:
        reason = f"{failure.reason}; gave up after {job.infra_failures} earlier infrastructure failures"
        return JobFailed(job_id=job.job_id, attempt=job.attempt, reason=reason, at=now)
    survivors = {p.node_id for p in job.placements} - set(failure.failed_nodes)
    if not survivors:
        # nothing to keep: back to the queue at once, at the job's original place
        return JobAttemptFailed(
            job_id=job.job_id, attempt=job.attempt, cause="infra", reason=failure.reason, retry_at=now, at=now
        )
    return JobInterrupted(
        job_id=job.job_id,
        attempt=job.attempt,
        failed_nodes=failure.failed_nodes,
        reason=failure.reason,
        at=now,
    )


#: The codes the rank wrapper (and a shell) records when the command never ran: the job's own doing, but
#: not a crash of the program, so the reason says what happened (the rank's log has the system's words).
_NOT_STARTED = {
    126: "the command could not be executed: not executable, or its arguments and environment are over "
    "the system's limits (Argument list too long); see the rank's log",
    127: "command not found; see the rank's log",
}


def _meaning(exit_code: int) -> str:
    meaning = _NOT_STARTED.get(exit_code)
    return f" ({meaning})" if meaning else ""


def _user_event(job: JobView, failure: UserFailure, now: float, config: RecoveryConfig) -> Event:
    what = f"rank {failure.rank} exited with code {failure.exit_code}{_meaning(failure.exit_code)}"
    return user_outcome(job, what, failure.exit_code, now, config)


def user_outcome(job: JobView, what: str, exit_code: int | None, now: float, config: RecoveryConfig) -> Event:
    """A user failure described by ``what``: a retry after the backoff while ``max_retries`` allows (a
    service: always), else ``JobFailed`` naming every attempt."""
    if job.user_failures < job.spec.max_retries or job.spec.kind == "service":
        return JobAttemptFailed(
            job_id=job.job_id,
            attempt=job.attempt,
            cause="user",
            reason=what,
            exit_code=exit_code,
            retry_at=now + backoff_s(job.user_failures, config),
            at=now,
        )
    if not job.attempt_reasons:
        return JobFailed(job_id=job.job_id, attempt=job.attempt, reason=what, exit_code=exit_code, at=now)
    history = [*job.attempt_reasons, f"attempt {job.attempt}: {what}"]
    reason = (
        f"{what} on attempt {job.attempt}; {job.user_failures + 1} failed attempts "
        f"(max_retries {job.spec.max_retries}): " + "; ".join(history)
    )
    return JobFailed(job_id=job.job_id, attempt=job.attempt, reason=reason, exit_code=exit_code, at=now)


# -- refused launches ---------------------------------------------------------------------------------


class LaunchRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's definite "no" to one task of a launch (``LaunchReply`` with ``ok`` False)."""

    node_id: str
    code: str
    error: str


#: What each refusal code says about the attempt. A refusal that names the node (GPUs it does not have,
#: another node's task, a task it cannot decode) is the infrastructure's: the bind and the node disagree.
#: One that names the job's spec (nothing to run) is the user's: it would be refused on any node.
#: A code not here (an older agent sends none) decides nothing: the launch is retried, as before codes.
REFUSAL_CAUSES: dict[str, FailureCause] = {
    REFUSED_UNKNOWN_GPUS: "infra",
    REFUSED_WRONG_NODE: "infra",
    REFUSED_BAD_REQUEST: "infra",
    REFUSED_EMPTY_COMMAND: "user",
}


def refusal_event(
    job: JobView, refusals: Sequence[LaunchRefusal], now: float, config: RecoveryConfig
) -> Event | None:
    """The event that records the refusal of ``job``'s launch, or None to try the launch again.

    A user refusal wins over infrastructure ones (the spec would be refused anywhere): it is retried with
    the user backoff up to ``max_retries``, then ``JobFailed``. Infrastructure refusals give every GPU
    back (nothing ran, nothing to keep) and requeue the job at once, up to ``max_infra_retries``. The
    reason names each refusing node and the agent's own words.
    """
    known = [(r, REFUSAL_CAUSES[r.code]) for r in refusals if r.code in REFUSAL_CAUSES]
    if not known:
        return None
    known.sort(key=lambda rc: rc[0].node_id)
    user = [r for r, cause in known if cause == "user"]
    chosen = user[:1] or [r for r, _ in known]  # the spec's fault reads the same on every node: name one
    what = "; ".join(f"launch refused by node {r.node_id}: {r.error}" for r in chosen)
    if user:
        return user_outcome(job, what, None, now, config)
    everyone = tuple(sorted({p.node_id for p in job.placements}))
    return _infra_event(job, InfraFailure(failed_nodes=everyone, reason=what), now, config)


# -- secrets gone -------------------------------------------------------------------------------------


def secrets_lost_event(job: JobView, missing: Sequence[str], now: float) -> Event:
    """``job`` cannot launch: its secrets ``missing`` are not in the secrets bucket (purged, or the bucket
    was lost). No retry brings them back and running without them is not what was asked: the job fails,
    saying how to run it again."""
    reason = (
        f"the job's secrets {', '.join(missing)} are not in the secrets store (rally-secrets): deleted or "
        "lost, so no attempt can start with them; submit the job again with its secrets"
    )
    return JobFailed(job_id=job.job_id, attempt=job.attempt, reason=reason, exit_code=None, at=now)
