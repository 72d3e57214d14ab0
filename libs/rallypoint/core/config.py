"""Policy configuration: one frozen Struct, loadable from JSON/YAML, recorded with every decision."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["PolicyConfig"]


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Knobs of the built-in plug-ins. Policies set their own defaults (see ``policies.py``); a config
    file overrides fields by name, e.g. ``{"policy": "rallypoint", "aging_step": 100}``.
    """

    #: version string recorded in decisions (GangBound.policy_version) for replay audits
    version: str = "1"
    #: EASY backfill: reserve the earliest slot of blocked head jobs and backfill around it
    backfill: bool = False
    #: how many blocked jobs get a reservation per cycle (EASY = 1)
    max_reservations: int = 1
    #: preemption (reclaim borrowed quota, then by priority / attained service)
    preemption: bool = False
    #: a job preempted less than this long ago is not preempted again
    preemption_protection_s: float = 600.0
    #: consolidation (KAI's "consolidate"): a gang blocked only by fragmentation may have a few small
    #: running jobs checkpointed and re-placed elsewhere to complete its nodes
    consolidation: bool = False
    #: consolidation attempts per cycle (bounds the cost of a cycle)
    max_consolidations_per_cycle: int = 4
    #: only gangs of at most this many tasks (nodes) are consolidated for
    consolidate_max_tasks: int = 2
    #: preemptors planned per cycle (bounds the cost of a cycle)
    max_preemptors_per_cycle: int = 4
    #: estimated delay between a preemption request and the victims' GPUs being free
    preemption_grace_s: float = 60.0
    #: aging: +aging_step priority per aging_interval_s waited, capped at aging_max (None = no cap)
    aging_interval_s: float = 3600.0
    aging_step: int = 0
    aging_max: int | None = None
    #: enforce queue quotas / cohorts
    quotas: bool = False
    #: elastic gangs: start between min and max, grow into idle GPUs, shrink before preempting
    elastic: bool = False
    #: LAS demotion thresholds on attained GPU-seconds (queue k holds jobs below thresholds[k])
    las_thresholds: tuple[float, ...] = (3250.0, 7200.0)
    #: LAS starvation guard: a job waiting longer than factor x its last run goes back to queue 0
    las_starvation_factor: float = 0.0
    #: rallypoint ordering: inside a priority class, discretized least-attained-service levels (on
    #: ``las_thresholds``) before DRF share; jobs of queues below their nominal quota go first (guaranteed
    #: share before borrowing); preemption by attained service only of the same queue or of borrowers
    class_las: bool = False
    #: with ``class_las``: the LAS level measures expected remaining work instead of attained service:
    #: GPUs x the runtime still estimated (learned runtime, else time limit) when the job has an estimate
    #: and has not outrun it, else its attained GPU-seconds (with no estimate a job is expected to run
    #: about as long again as it has: the heavy-tail reasoning behind LAS). Level 0 below
    #: ``estimate_level_gpu_s``, then one level per doubling; ``las_thresholds`` are not used
    level_by_estimate: bool = False
    estimate_level_gpu_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    #: with ``class_las``: a waiting job moves up one LAS level per this many seconds waited since it last
    #: ran (0 = never; levels never cross priority classes)
    level_aging_s: float = 0.0
    #: with ``class_las``: priority classes of at least this value are strictly first (each its own band);
    #: lower classes share one band in which the LAS level comes before the class value (None: every
    #: class is its own band; rallypoint's default is 800: production and training-high are strict)
    strict_class_min: int | None = None
    #: with ``class_las``: a job blocked by its queue's quota (cohort has nothing left to lend) may preempt
    #: lower-ranked jobs of its own queue or lower-ranked borrowers, when that makes quota and GPU room
    preempt_for_quota: bool = False
    #: with ``class_las``: a job that started (or was last preempted) less than this long ago is no LAS
    #: (same-class, attained-service) victim; a lower-class (priority) victim only needs
    #: ``preemption_protection_s`` since its last preemption, and reclaim of borrowed quota ignores both
    #: (guaranteed quota comes back at once). None: ``preemption_protection_s`` since the last preemption
    start_protection_s: float | None = None
    #: FIFO semantics: first fit, and jobs of at most one node's GPUs must sit on one node
    first_fit: bool = False
    consolidate_small: bool = False
    #: stop at the first job that does not fit (strict head-of-line blocking)
    stop_at_first_block: bool = False
