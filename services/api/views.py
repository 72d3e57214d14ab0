"""JSON shapes of jobs and nodes, read from the fold. Presentation only: no state is changed here.

Every view is rendered for an ``Audience``: an admin sees every job; a team token sees its own team's jobs
in full and of another team's only that they exist (counts, GPUs held, queue positions), never their ids or
names, not even inside a message ("preempting 1 job (j-...)" reads "preempting 1 job (another team's
job)"). Handlers list only what the audience may see; the audience redacts what is left in between.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from rallypoint.control.drain import (
    DEFAULT_DRAIN_POLICY,
    DrainPlan,
    DrainPolicy,
    JobDrain,
    drain_plan,
    out_of_service,
)
from rallypoint.jobs.history import current_reason
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState, JobView, NodeView
from rallypoint.state.dependencies import hold_code

from .auth import principal

# What a pending job shows before the scheduler has said anything about it.
AWAITING_CODE = "AwaitingScheduler"
AWAITING_MESSAGE = "submitted; the scheduler has not looked at it yet"


#: What a team token reads where another team's job id stood: the job is counted, never named.
OTHER_TEAM_JOB = "another team's job"
#: The ids this API hands out (``jobs.new_job_id``, ``jobs.job_id_for``): a word of this shape is hidden
#: unless it names a job the reader may see, even when this fold does not know it (deny by default).
_API_JOB_ID = re.compile(r"j-[0-9a-f]{12}")
#: A word that may be a job id: ids are subject tokens (``events.subjects.TOKEN_PATTERN``), all ASCII.
_WORD = re.compile(r"[A-Za-z0-9_-]+")
#: The same with the "job " messages put before an id, replaced with it: a hidden one reads "would delay
#: another team's job", not "would delay job another team's job".
_JOB_WORD = re.compile(r"(?:\bjob )?(?<![A-Za-z0-9_-])([A-Za-z0-9_-]+)")
#: As ``_JOB_WORD`` for the API's ids only: a replacement that stops at them, not at every word.
_API_JOB_WORD = re.compile(r"(?:\bjob )?(?<![A-Za-z0-9_-])(j-[0-9a-f]{12})(?![A-Za-z0-9_-])")


class Audience:
    """Who a view is rendered for, and so which job ids it may carry: every one for an admin, the own
    team's for a team token. ``text`` and ``scrub`` put ``OTHER_TEAM_JOB`` in place of any other."""

    def __init__(self, team: str | None, jobs: Mapping[str, JobView]) -> None:
        self.team = team  # None: an admin, who sees everything
        self.jobs = jobs

    @classmethod
    def of(cls, who: Principal, jobs: Mapping[str, JobView]) -> Audience:
        # A token that is neither an admin's nor a team's sees no job (an empty team owns none).
        return cls(None if who.admin else who.team or "", jobs)

    @property
    def sees_all(self) -> bool:
        return self.team is None

    def sees(self, job_id: str) -> bool:
        if self.team is None:
            return True
        job = self.jobs.get(job_id)
        return job is not None and job.spec.team == self.team

    def job_ref(self, job_id: str | None) -> str | None:
        """A field that holds one job id: the id, or ``OTHER_TEAM_JOB`` when it is not the reader's."""
        if job_id is None or self.sees(job_id):
            return job_id
        return OTHER_TEAM_JOB

    def text(self, message: str) -> str:
        """``message`` with every job id the reader may not see replaced by ``OTHER_TEAM_JOB``."""
        if self.team is None or not message:
            return message
        # Most messages name no job: find that out without a Python call per word, and without a set
        # operation against the fold's jobs (``set & dict.keys()`` walks every job: 100 ms a page).
        words = _WORD.findall(message)
        named = set(filter(self.jobs.__contains__, words)) | set(_API_JOB_ID.findall(message))
        hidden = {word for word in named if word in words and not self.sees(word)}
        if not hidden:
            return message
        words_of = _API_JOB_WORD if all(_API_JOB_ID.fullmatch(word) for word in hidden) else _JOB_WORD
        return words_of.sub(lambda m: OTHER_TEAM_JOB if m.group(1) in hidden else m.group(0), message)

    def scrub(self, value: Any, *, keep: frozenset[str] = frozenset({"spec"})) -> Any:
        """``value`` (JSON builtins) with ``text`` applied to every string, except under the keys in
        ``keep`` (a job's own spec is shown as it was submitted)."""
        if self.team is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.scrub(item, keep=keep) for item in value]
        if isinstance(value, dict):
            return {k: v if k in keep else self.scrub(v, keep=keep) for k, v in value.items()}
        return value


#: The audience of the views only an admin reaches (``node_ops``): nothing is hidden.
EVERYONE = Audience(None, {})


def audience(request: web.Request, jobs: Mapping[str, JobView]) -> Audience:
    """Who ``request``'s answer is for, as its token says (``jobs``: the fold's, to tell whose an id is)."""
    return Audience.of(principal(request), jobs)


def job_links(job_id: str) -> dict[str, str]:
    return {"self": f"/v1/jobs/{job_id}"}


def queue_positions(state: ClusterState) -> dict[str, int]:
    """1-based position of each pending job in the scheduler's order, as its last reason gave it (the same
    reason whose message says how many jobs are ahead). A job the scheduler has not placed in its order yet
    has none: arrival order is not the order it walks."""
    return {
        job.job_id: job.pending_position + 1
        for job in state.pending_jobs()
        if job.pending_position is not None and job.pending_code and not job.cancel_requested
    }


def pending_reason(job: JobView, reader: Audience, held: str | None = None) -> dict[str, Any] | None:
    """Why the job waits: the scheduler's code and message with numbers, how many jobs are ahead of it in
    the policy's order, and when the scheduler said so (reasons are refreshed as their numbers change).
    ``held``: why its dependencies or its name hold it (``ClusterState.hold_of``); the scheduler does not
    see such a job, so this is its reason."""
    if job.state != "pending":
        return None
    if job.cancel_requested:
        return {"code": "CancelRequested", "message": "cancellation requested; waiting for the controller"}
    if held is not None:
        return {"code": hold_code(held), "message": reader.text(held)}
    if job.pending_code:
        return {
            "code": job.pending_code,
            "message": reader.text(job.pending_message),
            "jobs_ahead": job.pending_position,
            "updated_at": job.pending_at,
        }
    return {"code": AWAITING_CODE, "message": AWAITING_MESSAGE}


def render_job(
    job: JobView,
    positions: dict[str, int],
    reader: Audience,
    drain: JobDrain | None = None,
    held: str | None = None,
) -> dict[str, Any]:
    """The job as ``reader`` may see it: only ``render_job`` of a job the reader may see is ever asked
    for; what names other jobs (the reasons, the job it is preempted for) is redacted for it. ``drain``:
    its plan on the out-of-service node under it (``control.drain.job_drain``), None when there is none."""
    spec = job.spec
    reason, last_interruption = current_reason(job)
    return {
        "job_id": job.job_id,
        "name": spec.name,
        "team": spec.team,
        "priority": spec.priority,
        "state": job.state,
        "attempt": job.attempt,
        "queue": job.queue,
        "gpus": spec.gpus,
        "gpus_per_task": spec.gpus_per_task,
        "ranks_per_task": spec.ranks_per_task,
        "world_size": job.world_size,
        "pending_reason": pending_reason(job, reader, held),
        "depends_on": [{"kind": d.kind, "job_id": reader.job_ref(d.job_id)} for d in spec.depends_on],
        "singleton": spec.singleton,
        "queue_position": positions.get(job.job_id),
        "allocation": [
            {"task": p.task, "node_id": p.node_id, "gpus": list(p.gpus)}
            | ({"mig": {"profile": p.mig.profile, "start": p.mig.start}} if p.mig is not None else {})
            | ({"milli": p.milli} if p.milli is not None else {})
            for p in sorted(job.placements, key=lambda p: p.task)
        ],
        "nodes": sorted({p.node_id for p in job.placements}),
        "submitted_at": job.submitted_at,
        "bound_at": job.bound_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "exit_code": job.exit_code,
        "reason": reader.text(reason) or None,
        "last_interruption": reader.text(last_interruption) or None,
        "drain": render_job_drain(drain, reader),
        "cancel_requested": job.cancel_requested,
        "suspend_requested": job.suspend_requested,
        "suspended_s": round(job.suspended_s, 3),
        "preemptions": job.preemptions,
        "last_preempted_at": job.last_preempted_at,
        "preempting_for": reader.job_ref(job.preempt_for),
        "recovery": render_recovery(job, reader),
        "submitted_seq": job.submitted_seq,
        "last_seq": job.last_seq,
        # a member's array is shown beside the spec, not in it: the request's array is the index expression
        "spec": {k: v for k, v in msgspec.to_builtins(spec).items() if k != "array"},
        "array": None if spec.array is None else msgspec.to_builtins(spec.array),
        "links": job_links(job.job_id),
    }


def render_job_drain(drain: JobDrain | None, reader: Audience) -> dict[str, Any] | None:
    """What happens to the job on the node being drained under it, and by when."""
    if drain is None:
        return None
    return {"node": drain.node_id, "reason": reader.text(drain.reason), **_plan(drain.plan)}


def _plan(plan: DrainPlan) -> dict[str, Any]:
    return {"plan": plan.plan, "deadline": plan.deadline, "detail": plan.detail}


def draining_jobs(node: NodeView, reader: Audience, policy: DrainPolicy) -> list[dict[str, Any]]:
    """The plan of each job on ``node`` the reader may see, while the node is out of service (else none)."""
    if not out_of_service(node):
        return []  # most nodes: no job to look at (GET /v1/nodes renders every node)
    out = []
    for job_id in sorted(node.job_ids()):
        job = reader.jobs.get(job_id)
        if job is None or not reader.sees(job_id) or job.terminal:
            continue
        plan = drain_plan(job, node, policy)
        if plan is not None:
            out.append({"job_id": job_id, **_plan(plan)})
    return out


def render_recovery(job: JobView, reader: Audience) -> dict[str, Any]:
    """What failures cost the job so far, and what it resumes from."""
    latest = job.latest_checkpoint()
    return {
        "user_failures": job.user_failures,
        "infra_failures": job.infra_failures,
        "max_retries": job.spec.max_retries,
        "retry_at": job.retry_at,
        "failed_nodes": list(job.failed_nodes),
        "interrupted_at": job.interrupted_at,
        "lost_gpu_s": job.lost_gpu_s,
        "resume_step": job.resume_step,
        "latest_checkpoint_step": latest.step if latest is not None else None,
        "attempts": [reader.text(reason) for reason in job.attempt_reasons],
    }


def render_node(
    node: NodeView, reader: Audience = EVERYONE, policy: DrainPolicy = DEFAULT_DRAIN_POLICY
) -> dict[str, Any]:
    """The node as ``reader`` may see it: another team's GPUs count as allocated, its jobs are not listed.
    ``draining_jobs`` reads the jobs from ``reader.jobs`` (the fold's) under the drain ``policy``."""
    return {
        "node_id": node.node_id,
        "address": node.address,
        "rack": node.rack,
        "spine": node.spine,
        "status": node.status,
        "status_reason": reader.text(node.status_reason) or None,
        "health": node.health,
        "health_since": node.health_since or None,
        "health_evidence": [msgspec.to_builtins(e) for e in node.health_evidence],
        "schedulable": node.schedulable,
        "gpu_type": node.gpu_type,
        "gpus": {
            "total": node.gpu_count,
            # A node that is not schedulable offers nothing, whatever its GPUs hold.
            "free": len(node.free_gpus()) if node.schedulable else 0,
            "allocated": len(node.allocated),
        },
        # which GPUs are held, whoever holds them: a team's dashboard shows another team's as busy
        "busy_gpus": sorted(node.allocated),
        # GPUs fractional jobs share: thousandths in use on each (which jobs: ``jobs``, the reader's own)
        "shared_gpus": {str(g): sum(held.values()) for g, held in sorted(node.shares.items())},
        # GPUs in MIG mode, each with the slices MIG jobs hold on it (any team's; whose: ``jobs``)
        "mig_gpus": {
            str(g.index): [
                {"profile": s.profile, "start": s.start}
                for s in sorted(node.slices.get(g.index, {}).values(), key=lambda s: s.start)
            ]
            for g in node.gpus
            if g.mig
        },
        "labels": dict(sorted(node.labels.items())),
        "taints": list(node.taints),
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "jobs": sorted(job_id for job_id in node.job_ids() if reader.sees(job_id)),
        "draining_jobs": draining_jobs(node, reader, policy),
        "registered_at": node.registered_at,
    }


def render_checkpoints(job: JobView) -> dict[str, Any]:
    """The job's checkpoints, oldest step first, and the one a restart resumes from (the fold says which)."""
    latest = job.latest_checkpoint()
    return {
        "job_id": job.job_id,
        "checkpoints": [
            {
                "step": c.step,
                "attempt": c.attempt,
                "path": c.path,
                "bytes": c.bytes,
                "shards": c.shards,
                "save_s": c.save_s,
                "committed_at": c.committed_at,
                "manifest_sha256": c.manifest_sha256,
                "status": c.status,
                "error": c.error or None,
            }
            for c in job.checkpoints
        ],
        "latest_complete": latest.step if latest is not None else None,
        "links": {"job": f"/v1/jobs/{job.job_id}"},
    }
