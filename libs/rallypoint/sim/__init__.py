"""Trace-driven simulator: replays a workload on a cluster through the real scheduling core.

``Simulator`` / ``simulate`` run one policy; ``run_policy`` is the entry point the CLI, the evaluation and the
benchmarks share. Formats: ``load_workload``, ``load_cluster``, ``load_queues``.
"""

from rallypoint.scheduling.queues import Queues, load_queues

from .cluster import Cluster, load_cluster
from .engine import SimError, SimOptions, SimResult, Simulator, simulate
from .metrics import JobRecord
from .run import InputError, run_policy
from .workload import Job, load_workload

__all__ = [
    "Cluster",
    "InputError",
    "Job",
    "JobRecord",
    "Queues",
    "SimError",
    "SimOptions",
    "SimResult",
    "Simulator",
    "load_cluster",
    "load_queues",
    "load_workload",
    "run_policy",
    "simulate",
]
