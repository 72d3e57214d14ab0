"""Subject naming: one subject per aggregate, so per-aggregate optimistic concurrency works.

Everything in the log lives under ``rally.`` (the stream's only subject filter). Heartbeats, agent
commands and queries use other prefixes on purpose: they are not facts and never enter the log.
"""

from __future__ import annotations

import re

STREAM_SUBJECTS = "rally.>"
JOBS = "rally.job.>"
NODES = "rally.node.>"
SCHEDULER_TREE = "rally.sched.>"
EPOCH = "rally.sched.epoch"
PREEMPTION_TREE = "rally.preempt.>"
PREEMPTION_EPOCH = "rally.preempt.epoch"

# Ids become subject tokens: no dots, wildcards or whitespace.
TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _token(value: str) -> str:
    if not TOKEN_PATTERN.match(value):
        raise ValueError(f"not a valid subject token: {value!r}")
    return value


def job(job_id: str) -> str:
    return f"rally.job.{_token(job_id)}"


CHECKPOINTS = "rally.ckpt.>"


def checkpoint(job_id: str) -> str:
    return f"rally.ckpt.{_token(job_id)}"


def node(node_id: str) -> str:
    return f"rally.node.{_token(node_id)}"


def bind(job_id: str) -> str:
    return f"rally.sched.bind.{_token(job_id)}"


def repair(job_id: str) -> str:
    """Repairs and requeues of an interrupted gang: scheduler decisions, on the fenced tree."""
    return f"rally.sched.repair.{_token(job_id)}"


def pending(job_id: str) -> str:
    return f"rally.sched.pending.{_token(job_id)}"


def preempt(job_id: str) -> str:
    return f"rally.preempt.request.{_token(job_id)}"


def heartbeat(node_id: str) -> str:
    return f"hb.{_token(node_id)}"


HEARTBEATS = "hb.*"


def agent_command(node_id: str, verb: str) -> str:
    """Request/reply subject of a node agent (``launch``, ``kill``, ``status``)."""
    return f"cmd.agent.{_token(node_id)}.{_token(verb)}"


def query(service: str, what: str) -> str:
    return f"q.{_token(service)}.{_token(what)}"
