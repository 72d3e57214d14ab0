"""JSON shapes of jobs and nodes, read from the fold. Presentation only: no state is changed here."""

from __future__ import annotations

from typing import Any

import msgspec

from rallypoint.state import ClusterState, JobView, NodeView

# What a pending job shows before the scheduler has said anything about it.
AWAITING_CODE = "AwaitingScheduler"
AWAITING_MESSAGE = "submitted; the scheduler has not looked at it yet"


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


def pending_reason(job: JobView) -> dict[str, Any] | None:
    """Why the job waits: the scheduler's code and message with numbers, how many jobs are ahead of it in
    the policy's order, and when the scheduler said so (reasons are refreshed as their numbers change)."""
    if job.state != "pending":
        return None
    if job.cancel_requested:
        return {"code": "CancelRequested", "message": "cancellation requested; waiting for the controller"}
    if job.pending_code:
        return {
            "code": job.pending_code,
            "message": job.pending_message,
            "jobs_ahead": job.pending_position,
            "updated_at": job.pending_at,
        }
    return {"code": AWAITING_CODE, "message": AWAITING_MESSAGE}


def render_job(job: JobView, positions: dict[str, int]) -> dict[str, Any]:
    spec = job.spec
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
        "pending_reason": pending_reason(job),
        "queue_position": positions.get(job.job_id),
        "allocation": [
            {"task": p.task, "node_id": p.node_id, "gpus": list(p.gpus)}
            for p in sorted(job.placements, key=lambda p: p.task)
        ],
        "nodes": sorted({p.node_id for p in job.placements}),
        "submitted_at": job.submitted_at,
        "bound_at": job.bound_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "exit_code": job.exit_code,
        "reason": job.reason or None,
        "cancel_requested": job.cancel_requested,
        "preemptions": job.preemptions,
        "last_preempted_at": job.last_preempted_at,
        "preempting_for": job.preempt_for,
        "recovery": render_recovery(job),
        "submitted_seq": job.submitted_seq,
        "last_seq": job.last_seq,
        "spec": msgspec.to_builtins(spec),
        "links": job_links(job.job_id),
    }


def render_recovery(job: JobView) -> dict[str, Any]:
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
        "attempts": list(job.attempt_reasons),
    }


def render_node(node: NodeView) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "address": node.address,
        "rack": node.rack,
        "spine": node.spine,
        "status": node.status,
        "status_reason": node.status_reason or None,
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
        "jobs": sorted(set(node.allocated.values())),
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
