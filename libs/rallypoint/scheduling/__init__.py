"""Glue between the folded log state and the pure core, shared by the scheduler service and audits."""

from .bridge import Write, build_snapshot, decision_writes, jobs_that_can_never_fit
from .config import core_queues, load_queue_config
from .policy import SchedulingPolicy

__all__ = [
    "SchedulingPolicy",
    "core_queues",
    "load_queue_config",
    "Write", "build_snapshot", "decision_writes", "jobs_that_can_never_fit"]
