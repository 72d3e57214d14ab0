"""Glue between the folded log state and the pure core, shared by the scheduler service and audits."""

from .bridge import (
    Write,
    admission_writes,
    build_snapshot,
    decision_writes,
    jobs_that_can_never_fit,
    preemption_writes,
    resize_writes,
    resized_placements,
)
from .config import core_queues, load_queue_config
from .model_sync import ModelSync
from .policy import SchedulingPolicy

__all__ = [
    "ModelSync",
    "SchedulingPolicy",
    "Write",
    "admission_writes",
    "build_snapshot",
    "core_queues",
    "decision_writes",
    "jobs_that_can_never_fit",
    "load_queue_config",
    "preemption_writes",
    "resize_writes",
    "resized_placements",
]
