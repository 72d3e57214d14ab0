"""The event-driven simulation loop around the real scheduling core.

The loop owns time, job progress, faults and measurement; every decision (which job, where, whom to preempt,
how to resize) comes from ``rallypoint.core.schedule`` with the policy the user named. Nothing here orders or
places jobs.

At each instant, in this order (the golden peers' rule): jobs ending now free their GPUs, failed nodes come
back, nodes fail (their jobs lose work back to their last checkpoint and wait again), jobs submitted now join
the queue, then the core runs once over the whole instant (again, at the same instant, after preemptions, so
freed GPUs are reused in the same second).

Costs modelled:

- preemption: the victim checkpoints and stops at once; when it starts again it first spends the cluster's
  ``faults.checkpoint_overhead`` seconds saving/restoring state (counted as lost GPU time);
- node failure: every job with a task on the node stops, keeps the progress of its last checkpoint (every
  ``checkpoint_interval`` seconds of running; none without one) and waits again, paying the overhead to
  restore;
- elastic resize: a checkpoint-restart at the new size (pays the overhead); speed is proportional to GPUs;
- fail-slow episodes (``SimOptions.failslow``, off by default; sim/failslow.py): while a node is slow, every
  gang with a task on it advances at 1 / (the largest slowdown among its nodes); with replacement on, a gang
  the straggler rule flags is restarted like a gang whose node failed, and the slow node is cordoned.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rallypoint.control.recovery import RecoveryConfig, backoff_s
from rallypoint.core import types as ct
from rallypoint.core.cluster import GPU_MILLI, ClusterModel
from rallypoint.events.catalogue import mig_milli
from rallypoint.scheduling.adapter import (
    affinity_groups,
    attempt_end,
    core_node,
    exceeds_cluster,
    pending_share,
    pending_time_limit,
)
from rallypoint.scheduling.bridge import resized_placements
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.pending import NEVER_FITS
from rallypoint.scheduling.queues import Queues
from rallypoint.userusage import UserLedger, UserUsage, end_attempt, start_attempt, usage_rows

from .cluster import Cluster
from .failslow import Episode, FailSlow, node_episodes, stragglers_in_gang
from .holds import ArrayLimits, Holds
from .metrics import JobRecord, Recorder, summarize
from .workload import Job

# event kinds, in the order they are applied within one instant
END, REPAIR, FAIL, SUBMIT, TICK = 0, 1, 2, 3, 4
# fail-slow events come after the others of their instant; none exist unless SimOptions.failslow is set
SLOW_START, SLOW_END, DETECT, UNCORDON = 5, 6, 7, 8
# a running gang commits a checkpoint (jobs with a checkpoint_interval): the core reads the last one
CKPT = 9
# a job's team suspends or resumes it (the workload's ``suspend_at`` / ``resume_at``)
SUSPEND, RESUME = 10, 11
# a service whose run ended is queued again once its backoff is over (``Simulator._service_exit``)
RESTART = 12

Scheduler = Callable[[ct.Snapshot, Any], ct.Decisions]


class SimError(RuntimeError):
    """The core returned a decision the simulator cannot apply (a core bug, reported with context)."""


def core_api() -> tuple[Scheduler, Callable[[str], Any]]:
    """``(schedule, policy_by_name)`` from the core; imported late so a core in progress does not break us."""
    from rallypoint import core

    return core.schedule, core.policy_by_name


def policy_names() -> tuple[str, ...]:
    return ("fifo", "easy-backfill", "las", "rallypoint")


@dataclass
class SimOptions:
    seed: int = 0
    # Re-run the core every ``tick`` seconds while jobs wait, even without events: LAS-style policies change
    # their mind as running jobs accrue service. None picks 0 for fifo/easy-backfill and 60 s otherwise.
    tick: float | None = None
    until: float | None = None  # stop the clock here (jobs not finished are not in the records)
    # A bind onto GPUs that are already taken is a core bug. strict: stop with SimError. Otherwise the bind is
    # dropped (the job stays pending, counted in ``bind_conflicts``) and the core runs again at once.
    strict: bool = False
    # After a cycle that stopped victims the core runs again at the same instant (the live scheduler cycles
    # on every change: the victims' GPUs are free as soon as they stop). Chains (consolidation moving jobs
    # whose movers then need room) are cut after this many cycles; the rest follows ``follow_up_s`` later,
    # so a stopped job never waits for an unrelated event to be re-placed.
    max_cycles_per_instant: int = 32
    follow_up_s: float = 1.0
    # Fail-slow episodes and straggler replacement (sim/failslow.py); None: no node is ever slow.
    failslow: FailSlow | None = None
    # The job controller's retry backoff, which a service waits out before each restart (the live default).
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)


class _SimJob:
    """Mutable progress of one job. ``remaining`` is in seconds at the full (requested) allocation."""

    __slots__ = (
        "alloc",
        "attained",
        "attempt",
        "ckpt_interval",
        "ckpt_origin",
        "ckpt_saved",
        "detect_due",
        "failures",
        "first_start",
        "job",
        "last_preempted",
        "lost_gpu_s",
        "nodes",
        "overhead_due",
        "pclass",
        "pending",
        "placed_nodes",
        "placed_type",
        "preemptions",
        "progress0",
        "racks",
        "rate",
        "remaining",
        "replace_lost_gpu_s",
        "replace_overhead",
        "replacements",
        "restarts",
        "retry_at",
        "run_id",
        "run_start",
        "run_time",
        "seg_start",
        "seq",
        "share",
        "slow_gpu_s",
        "slowdown",
        "suspended",
        "suspensions",
    )

    def __init__(self, job: Job, seq: int, pclass: str) -> None:
        self.job = job
        self.seq = seq
        self.pclass = pclass
        self.remaining = job.duration
        self.progress0 = 0.0
        self.attempt = 0
        self.first_start: float | None = None
        self.seg_start = 0.0
        self.run_start = 0.0
        self.rate = 1.0
        self.alloc = 0
        self.share = 0.0  # GPUs its attained service counts while it runs (``_gpu_share``)
        self.run_time = 0.0
        self.preemptions = 0
        self.failures = 0
        self.lost_gpu_s = 0.0
        self.attained = 0.0  # GPU-seconds attained before the current segment
        self.last_preempted: float | None = None
        self.overhead_due = 0.0
        self.ckpt_interval = job.checkpoint_interval
        self.suspended = False  # suspended by its team: neither queued nor running until resumed
        self.restarts = 0  # a service's runs that ended (each one a user failure to the job controller)
        # a service whose last run ended: when it ended and when it may start again (None: it did not)
        self.retry_at: tuple[float, float] | None = None
        # every suspension: [when, when resumed (None: not yet)], in order (the twin replays them)
        self.suspensions: list[list[float | None]] = []
        self.nodes = 0
        self.racks = 0
        self.placed_type: str | None = None
        self.pending: ct.PendingJob | None = None
        # Progress is piecewise linear: ``progress0`` at ``run_start``, then ``rate`` per second. A fail-slow
        # change of rate starts a new piece; checkpoints stay on the grid of the attempt's own start
        # (``ckpt_origin``), and ``ckpt_saved`` is the last one taken before the current piece.
        self.ckpt_origin = 0.0
        self.ckpt_saved = 0.0
        self.slowdown = 1.0  # the largest fail-slow factor among the gang's nodes
        self.placed_nodes: tuple[str, ...] = ()
        self.detect_due = math.inf  # when the detection for the current node speeds is due (inf: none)
        self.run_id = 0  # counts placements: a detection scheduled for an earlier one is stale
        self.slow_gpu_s = 0.0  # GPU-seconds held beyond what the work needed at full speed
        self.replacements = 0
        self.replace_lost_gpu_s = 0.0  # redone work plus restore overhead, from straggler replacements
        self.replace_overhead = False  # the overhead due comes from a replacement


def _gpu_share(job: Job, gpus: int, placements: tuple[ct.TaskPlacement, ...]) -> float:
    """The GPUs a running job's attained service counts, as the live fold counts them (``quota_milli``):
    a share's or a MIG slice's part of one GPU, else the ``gpus`` it holds."""
    if job.gpu_milli is not None or job.gpu_memory_mib is not None:
        held = placements[0].milli if placements and placements[0].milli is not None else job.gpu_milli
        return (held or 0) / GPU_MILLI
    if job.mig_profile is not None:
        return mig_milli(job.mig_profile) / GPU_MILLI
    return float(gpus)


def to_core_nodes(cluster: Cluster) -> list[ct.Node]:
    """The cluster file's nodes as the core sees them (``adapter.core_node``, as the scheduler's bridge):
    ``nvlink_domain`` GPUs per domain, GPU ``i`` in domain ``i // nvlink_domain``."""
    return [
        core_node(
            n.id,
            rack=n.rack,
            spine=n.spine,
            gpu_type=n.gpu_type,
            gpus=[(i, i // n.nvlink_domain if n.nvlink_domain else 0) for i in range(n.gpus)],
            cpu_milli=n.cpu,
            memory_mib=n.memory,
            mig_gpus=n.mig_gpus,
            labels=tuple(sorted(n.labels.items())),
            taints=tuple(sorted(n.taints)),
            gpu_memory_mib=n.gpu_memory,
        )
        for n in cluster.nodes
    ]


def to_core_queues(q: Queues | None) -> tuple[tuple[ct.Queue, ...], tuple[ct.PriorityClass, ...]]:
    """The queue file as the core sees it: the scheduler service's own translation (teams, orgs and their
    limits), so the simulator and a live cluster enforce the same quotas."""
    if q is None:
        return (), ct.DEFAULT_PRIORITY_CLASSES
    return core_queues(q)  # classes too: an empty list means no classes there, so here as well


@dataclass
class SimResult:
    records: list[JobRecord]
    summary: dict[str, Any]
    recorder: Recorder
    cycles: int = 0
    unfinished: list[str] = field(default_factory=list)


class Simulator:
    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: Cluster,
        policy: str,
        queues: Queues | None = None,
        options: SimOptions | None = None,
        scheduler: Scheduler | None = None,
        policy_obj: Any = None,
    ) -> None:
        self.opts = options or SimOptions()
        self.cluster = cluster
        self.policy_name = policy
        sched, by_name = core_api() if scheduler is None else (scheduler, None)
        self.schedule = sched
        self.policy = policy_obj if policy_obj is not None else (by_name(policy) if by_name else policy)
        self.queues_cfg = queues
        self.core_queues, self.core_classes = to_core_queues(queues)
        default_class = queues.default_priority if queues else "training-standard"
        # an interactive session's own class, where the cluster has it (the API's default for that kind)
        interactive_class = next((c.name for c in self.core_classes if c.name == "interactive"), None)
        interactive_class = interactive_class or default_class
        self.model = ClusterModel(to_core_nodes(cluster))
        self.node_gpus = {n.id: n.gpus for n in cluster.nodes}
        self.node_rack = {n.id: n.rack for n in cluster.nodes}
        self.node_type = {n.id: n.gpu_type for n in cluster.nodes}
        self.jobs: dict[str, _SimJob] = {}
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
        for seq, i in enumerate(order):
            j = jobs[i]
            default = interactive_class if j.kind == "interactive" else default_class
            self.jobs[j.id] = _SimJob(j, seq, j.priority or default)
        self.rng = random.Random(self.opts.seed)
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._ctr = 0
        self.pending: dict[str, _SimJob] = {}
        self.running: dict[str, _SimJob] = {}
        self.on_node: dict[str, set[str]] = {n.id: set() for n in cluster.nodes}
        self.down: set[str] = set()
        self.healthy_gpus = cluster.total_gpus
        self.allocated = 0
        self.elastic_running = 0
        self.unsubmitted = len(self.jobs)
        self.bind_conflicts = 0
        self.rejected: list[str] = []
        self.resumes_due = 0  # RESUME events still in the heap
        self.restarts_due = 0  # RESTART events still in the heap
        self.service_ids = frozenset(j.id for j in jobs if j.kind == "service")
        self.holds = Holds(self._placed)
        self.limits = ArrayLimits(jobs)
        self.arrived: set[str] = set()
        self.has_holds = any(j.depends_on or j.singleton for j in jobs)
        self.pending_gpus = 0
        self.team_alloc: Counter[str] = Counter()
        # (team, user) -> the service of the user's jobs (``userusage``), as the live fold keeps it
        self.user_ledgers: dict[tuple[str, str], UserLedger] = {}
        self.team_pending_sizes: dict[str, Counter[int]] = {}
        self.records: list[JobRecord] = []
        self.cycles = 0
        tick = self.opts.tick
        self.tick = tick if tick is not None else (0.0 if policy in ("fifo", "easy-backfill") else 60.0)
        self._tick_at: float | None = None
        nominal = queues.nominals() if queues else {}
        horizon = max((j.submit for j in jobs), default=0.0) + max((j.duration for j in jobs), default=1.0)
        self.rec = Recorder(total_gpus=cluster.total_gpus, nominal=nominal, horizon=horizon)
        self.fs = self.opts.failslow if self.opts.failslow is not None else cluster.faults.fail_slow
        self.node_slow: dict[str, dict[int, float]] = {}  # node -> {episode id: factor} under way
        self.episodes: dict[int, Episode] = {}
        self._episode_feed: dict[str, Any] = {}  # node -> iterator of its generated episodes
        self.cordoned: set[str] = set()
        self.cordon_until: dict[str, float] = {}
        self.fs_counts: Counter[str] = Counter()

    # --- events ----------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, key: str, version: int = 0) -> None:
        self._ctr += 1
        heapq.heappush(self.heap, (t, kind, self._ctr, key, version))

    def _seed_events(self) -> None:
        for sj in self.jobs.values():
            self._push(sj.job.submit, SUBMIT, sj.job.id)
            if sj.job.suspend_at is not None:
                self._push(sj.job.suspend_at, SUSPEND, sj.job.id)
            if sj.job.resume_at is not None:
                self._push(sj.job.resume_at, RESUME, sj.job.id)
                self.resumes_due += 1
        mtbf = self.cluster.faults.node_mtbf
        if mtbf:
            for n in self.cluster.nodes:
                self._push(self.rng.expovariate(1.0 / mtbf), FAIL, n.id)
        for i, ev in enumerate(self.cluster.faults.events):
            self._push(ev.at, FAIL, ev.node, -1 - i)  # negative version: scripted, see _on_fail
        if self.fs is not None:
            self._seed_episodes(self.fs)

    def _seed_episodes(self, fs: FailSlow) -> None:
        if fs.episodes is not None:
            for ep in fs.episodes:
                if ep.node not in self.node_gpus:
                    raise SimError(f"fail-slow episode on unknown node {ep.node!r}")
                self._push_episode(ep)
            return
        for n in self.cluster.nodes:
            feed = node_episodes(n.id, fs.seed, fs.model)
            self._episode_feed[n.id] = feed
            self._push_episode(next(feed))

    def _push_episode(self, ep: Episode) -> None:
        i = len(self.episodes)
        self.episodes[i] = ep
        self._push(ep.start, SLOW_START, ep.node, i)

    # --- pending bookkeeping ---------------------------------------------------------------------

    def _make_pending(self, sj: _SimJob, now: float) -> ct.PendingJob:
        j = sj.job
        types = j.gpu_types
        return ct.PendingJob(
            id=j.id,
            team=j.team,
            priority_class=sj.pclass,
            gpus=j.gpus,
            gpus_per_task=j.task_gpus,
            submit_time=j.submit,
            arrival=sj.seq,
            time_limit_s=pending_time_limit(j.time_limit),
            # one allowed type ("A"): gpu_type; several ("A|B"): gpu_types, in the workload's order
            gpu_type=types[0] if len(types) == 1 else None,
            gpu_types=types if len(types) > 1 else None,
            min_gpus=j.min_gpus,
            max_gpus=j.max_gpus,
            gpu_step=j.gpu_step,
            attained_gpu_s=sj.attained,
            last_preempted_at=sj.last_preempted,
            last_run_s=sj.run_time,
            name=j.job_name,  # the scheduler passes its spec's (twin.job_spec: the same)
            user=j.user,
            cpu_milli=j.cpu_milli,
            memory_mib=j.memory_mib,
            gpu_milli=pending_share(j.gpu_milli, j.gpu_memory_mib),
            gpu_memory_mib=j.gpu_memory_mib,
            mig_profile=j.mig_profile,
            node_selector=tuple(sorted(j.node_selector.items())),
            tolerations=tuple(sorted(set(j.tolerations))),
            affinity=j.affinity,
            service=j.kind == "service",
        )

    def _submit(self, sj: _SimJob, now: float) -> bool:
        """A job arrives: admitted into the queue, or rejected at once by the scheduler's admission rule
        (larger than the whole cluster), so the core never sees it, as a live scheduler's never does."""
        self.unsubmitted -= 1
        self.arrived.add(sj.job.id)
        held = self.holds.arrive(sj.job, sj.seq)
        if exceeds_cluster(sj.job.gpus, self.cluster.total_gpus):
            self.holds.held.pop(sj.job.id, None)
            self._reject(sj.job.id)
            return False
        if held:
            return False  # queued once its dependencies are met (_release_held)
        self._enqueue(sj, now)
        return True

    def _placed(self, job_id: str) -> bool:
        """Whether the job's first attempt was given its GPUs (``after`` dependencies wait for it)."""
        sj = self.jobs.get(job_id)
        return sj is not None and sj.first_start is not None

    def _reject(self, job_id: str) -> None:
        self.rejected.append(job_id)
        self.holds.end(self.jobs[job_id].job, "rejected")

    def _release_held(self, now: float) -> bool:
        """Queue the held jobs whose dependencies are now met (ending those that never can be); True when
        any was queued."""
        free = self.holds.release() if self.holds.held else []
        for job_id in free:
            self._enqueue(self.jobs[job_id], now)
        if not self.limits.arrays:
            return bool(free)
        to_queue, to_hold = self.limits.rebalance(
            arrived=self.arrived, ended=self.holds.ended, queued=self.pending, running=self.running
        )
        for job_id in to_hold:
            self._dequeue(self.jobs[job_id])
        for job_id in to_queue:
            self._enqueue(self.jobs[job_id], now)
        return bool(free or to_queue)

    def _enqueue(self, sj: _SimJob, now: float) -> None:
        sj.pending = self._make_pending(sj, now)
        self.pending[sj.job.id] = sj
        self.team_pending_sizes.setdefault(sj.job.team, Counter())[sj.job.gpus] += 1
        self.pending_gpus += sj.job.gpus

    def _dequeue(self, sj: _SimJob) -> None:
        del self.pending[sj.job.id]
        sj.pending = None
        self.pending_gpus -= sj.job.gpus
        c = self.team_pending_sizes[sj.job.team]
        c[sj.job.gpus] -= 1
        if not c[sj.job.gpus]:
            del c[sj.job.gpus]

    # --- running bookkeeping ---------------------------------------------------------------------

    def _start(self, sj: _SimJob, now: float, gpus: int, placements: tuple[ct.TaskPlacement, ...]) -> None:
        j = sj.job
        sj.attempt += 1
        sj.alloc = gpus
        sj.share = _gpu_share(j, gpus, placements)
        sj.rate = gpus / j.gpus
        sj.seg_start = now
        sj.run_start = now + sj.overhead_due
        sj.lost_gpu_s += sj.overhead_due * gpus
        if sj.replace_overhead:
            sj.replace_lost_gpu_s += sj.overhead_due * gpus
            sj.replace_overhead = False
        sj.overhead_due = 0.0
        sj.progress0 = j.duration - sj.remaining
        sj.ckpt_origin = sj.run_start
        sj.ckpt_saved = sj.progress0
        sj.run_id += 1
        node_ids = {p.node_id for p in placements}
        if self.fs is not None:
            self._place_slow(sj, now, node_ids)
        if sj.first_start is None:
            sj.first_start = now
            sj.nodes = len(node_ids)
            sj.racks = len({self.node_rack[n] for n in node_ids})
            sj.placed_type = self.node_type[placements[0].node_id] if placements else None
        end = sj.run_start + sj.remaining / sj.rate
        types = j.gpu_types
        rj = ct.RunningJob(
            id=j.id,
            team=j.team,
            priority_class=sj.pclass,
            gpus=gpus,
            # the job's one GPU type, as the scheduler passes its spec's (None: the core reads the type of
            # the nodes it runs on); whether it may be preempted is its class's, which the core reads
            gpu_type=types[0] if len(types) == 1 else None,
            placements=placements,
            start_time=now,
            expected_end=attempt_end(now, j.time_limit),
            last_checkpoint=None,
            min_gpus=j.min_gpus,
            max_gpus=j.max_gpus,
            gpu_step=j.gpu_step,
            gpus_per_task=j.task_gpus,
            attained_gpu_s=sj.attained,
            last_preempted_at=sj.last_preempted,
            submit_time=j.submit,
            cpu_milli=j.cpu_milli,
            memory_mib=j.memory_mib,
            gpu_milli=placements[0].milli if placements and placements[0].milli is not None else j.gpu_milli,
            mig_profile=j.mig_profile,
            affinity_groups=affinity_groups(j.affinity),
            # a service or a session is never preempted, whatever its class (as the scheduler's bridge says)
            preemptible=j.kind not in ("service", "interactive"),
            service=j.kind == "service",
        )
        sj.retry_at = None
        self.model.bind(rj)  # raises ValueError on a double bind; callers check first
        for n in node_ids:
            self.on_node[n].add(j.id)
        self.running[j.id] = sj
        self.elastic_running += j.elastic
        self.allocated += gpus
        self.team_alloc[j.team] += gpus
        if j.user is not None:
            start_attempt(self.user_ledgers.setdefault((j.team, j.user), UserLedger()), j.id, now, gpus)
        self._push(end, END, j.id, sj.attempt)
        if sj.ckpt_interval:
            self._push(sj.ckpt_origin + sj.ckpt_interval, CKPT, j.id, sj.run_id)

    def _stop(self, sj: _SimJob, now: float, saved_progress: float | None) -> None:
        """Take a running job off its GPUs at ``now``; keep ``saved_progress`` (None: all progress)."""
        j = sj.job
        rj = self.model.unbind(j.id)
        for p in rj.placements:
            self.on_node[p.node_id].discard(j.id)
        del self.running[j.id]
        self.elastic_running -= j.elastic
        self.allocated -= sj.alloc
        self.team_alloc[j.team] -= sj.alloc
        if j.user is not None:
            end_attempt(self.user_ledgers[(j.team, j.user)], j.id, now)
        held = now - sj.seg_start
        if sj.slowdown != 1.0:
            self._bank_slow(sj, now)
            sj.slowdown = 1.0
        sj.run_time += held
        sj.attained += held * sj.share
        progress = sj.progress0 + max(0.0, now - sj.run_start) * sj.rate
        progress = min(progress, j.duration)
        if saved_progress is not None and saved_progress < progress:
            sj.lost_gpu_s += (progress - saved_progress) * j.gpus
            progress = saved_progress
        sj.remaining = j.duration - progress
        sj.attempt += 1  # invalidates the END event of the stopped run

    def _checkpointed_progress(self, sj: _SimJob, now: float) -> float:
        if not sj.ckpt_interval or now <= sj.ckpt_origin:
            return sj.ckpt_saved
        if sj.run_start == sj.ckpt_origin:  # one piece since the start (always, without fail-slow)
            k = math.floor((now - sj.run_start) / sj.ckpt_interval)
            return min(sj.job.duration, sj.progress0 + k * sj.ckpt_interval * sj.rate)
        last = sj.ckpt_origin + math.floor((now - sj.ckpt_origin) / sj.ckpt_interval) * sj.ckpt_interval
        if last <= sj.run_start:
            return sj.ckpt_saved
        return min(sj.job.duration, sj.progress0 + (last - sj.run_start) * sj.rate)

    # --- fail-slow -------------------------------------------------------------------------------

    def _node_factor(self, node_id: str) -> float:
        active = self.node_slow.get(node_id)
        return max(active.values()) if active else 1.0

    def _gang_factor(self, sj: _SimJob) -> float:
        return max((self._node_factor(n) for n in sj.placed_nodes), default=1.0)

    def _bank_slow(self, sj: _SimJob, now: float) -> None:
        """Count the GPU time held beyond the work done, for the current piece up to ``now``."""
        if now > sj.run_start:
            sj.slow_gpu_s += sj.alloc * (now - sj.run_start) * (1.0 - 1.0 / sj.slowdown)

    def _place_slow(self, sj: _SimJob, now: float, node_ids: set[str]) -> None:
        """A gang just placed: it runs at the pace of its slowest node from the start."""
        sj.placed_nodes = tuple(sorted(node_ids))
        sj.detect_due = math.inf
        f = self._gang_factor(sj)
        if f != 1.0:
            sj.slowdown = f
            sj.rate = sj.rate / f
            self._schedule_detect(sj, now)

    def _schedule_detect(self, sj: _SimJob, now: float) -> None:
        """The detector can judge the gang once its node speeds have held for the window; an earlier
        check still queued becomes stale (its time is no longer ``detect_due``)."""
        if self.fs is not None and self.fs.replace:
            sj.detect_due = now + self.fs.detect_after_s
            self._push(sj.detect_due, DETECT, sj.job.id, sj.run_id)

    def _reslow(self, sj: _SimJob, now: float) -> None:
        """A node of this running gang changed speed: start a new piece of progress at the new rate."""
        sj.detect_due = math.inf
        f = self._gang_factor(sj)
        if f != sj.slowdown:
            if now > sj.run_start:
                sj.ckpt_saved = self._checkpointed_progress(sj, now)
                if sj.slowdown != 1.0:
                    self._bank_slow(sj, now)
                sj.progress0 = min(sj.job.duration, sj.progress0 + (now - sj.run_start) * sj.rate)
                sj.run_start = now
            sj.slowdown = f
            sj.rate = sj.alloc / sj.job.gpus / f
            sj.attempt += 1  # invalidates the END event computed at the old rate
            self._push(sj.run_start + (sj.job.duration - sj.progress0) / sj.rate, END, sj.job.id, sj.attempt)
        if f != 1.0:
            self._schedule_detect(sj, now)

    def _on_slow_start(self, node_id: str, ep_id: int, now: float) -> bool:
        ep = self.episodes[ep_id]
        self.fs_counts["episodes"] += 1
        self.node_slow.setdefault(node_id, {})[ep_id] = ep.factor
        self._push(ep.end, SLOW_END, node_id, ep_id)
        feed = self._episode_feed.get(node_id)
        if feed is not None:
            self._push_episode(next(feed))
        for jid in sorted(self.on_node[node_id]):
            self._reslow(self.running[jid], now)
        return False  # no decision changes: the core does not see speeds

    def _on_slow_end(self, node_id: str, ep_id: int, now: float) -> bool:
        active = self.node_slow[node_id]
        del active[ep_id]
        if not active:
            del self.node_slow[node_id]
        for jid in sorted(self.on_node[node_id]):
            self._reslow(self.running[jid], now)
        if node_id in self.cordoned and not active:
            assert self.fs is not None
            until = now + self.fs.probation_s
            self.cordon_until[node_id] = until
            self._push(until, UNCORDON, node_id)
        return False

    def _on_detect(self, job_id: str, run_id: int, now: float) -> bool:
        """The detection window has passed since the gang's node speeds last changed: apply the rule."""
        sj = self.running.get(job_id)
        fs = self.fs
        if sj is None or sj.run_id != run_id or fs is None or now != sj.detect_due:
            return False  # stale: restarted since, or the speeds changed again (a later check is due)
        per_node: Counter[str] = Counter()
        for p in self.model.running[job_id].placements:
            per_node[p.node_id] += len(p.gpus)
        factors = {n: self._node_factor(n) for n in per_node}
        flagged = stragglers_in_gang(sorted(per_node.items()), factors, fs, now)
        if not flagged:
            self.fs_counts["checks_not_flagged"] += 1
            return False
        for n in flagged:
            self._cordon(n)
        self._replace(sj, now)
        return True

    def _cordon(self, node_id: str) -> None:
        if node_id not in self.cordoned:
            self.fs_counts["cordons"] += 1
            self.cordoned.add(node_id)
            self.cordon_until[node_id] = math.inf  # set when its episodes are over: then the probation
            if node_id not in self.down:
                self.model.set_schedulable(node_id, False)
                self.healthy_gpus -= self.node_gpus[node_id]

    def _on_uncordon(self, node_id: str, now: float) -> bool:
        if node_id not in self.cordoned or now < self.cordon_until[node_id] or node_id in self.node_slow:
            return False  # re-cordoned, or slow again: a later event ends it
        self.cordoned.discard(node_id)
        del self.cordon_until[node_id]
        if node_id not in self.down:
            self.model.set_schedulable(node_id, True)
            self.healthy_gpus += self.node_gpus[node_id]
        return True

    def _replace(self, sj: _SimJob, now: float) -> None:
        """Restart a gang off its straggler: the node-failure recovery (back to the last checkpoint, pay
        the restore overhead, wait for the core to place it again), counted apart."""
        before = sj.lost_gpu_s
        self._stop(sj, now, self._checkpointed_progress(sj, now))
        sj.replace_lost_gpu_s += sj.lost_gpu_s - before
        sj.replacements += 1
        self.fs_counts["replacements"] += 1
        assert self.fs is not None
        own = self.fs.restart_overhead_s
        sj.overhead_due = self.cluster.faults.checkpoint_overhead if own is None else own
        sj.replace_overhead = True
        self._enqueue(sj, now)

    # --- event handlers --------------------------------------------------------------------------

    def _on_suspend(self, job_id: str, now: float) -> bool:
        """Its team suspends the job: a running one checkpoints and stops (as on a preemption: nothing of
        its progress is lost), a waiting one leaves the queue; one not arrived, held or ended is left."""
        sj = self.jobs[job_id]
        if job_id in self.running:
            self._stop(sj, now, None)
            sj.overhead_due = self.cluster.faults.checkpoint_overhead
        elif job_id in self.pending:
            self._dequeue(sj)
        else:
            return False
        sj.suspended = True
        sj.suspensions.append([now, None])
        return True

    def _on_resume(self, job_id: str, now: float) -> bool:
        """Back in the queue, in its original place (its arrival order)."""
        sj = self.jobs[job_id]
        self.resumes_due -= 1
        if not sj.suspended:
            return False
        sj.suspended = False
        sj.suspensions[-1][1] = now
        self._enqueue(sj, now)
        return True

    def _on_checkpoint(self, job_id: str, run_id: int, now: float) -> bool:
        """A running gang committed a checkpoint (on the grid of its attempt's start, the one a failure
        falls back to): the core counts a victim's lost work from it, as the scheduler counts it from the
        log's last ``CheckpointCommitted``. No decision changes by itself: the core is not re-run."""
        sj = self.running.get(job_id)
        if sj is None or sj.run_id != run_id or not sj.ckpt_interval:
            return False  # stopped or restarted since: its next attempt keeps its own grid
        rj = self.model.running[job_id]
        self.model.update_running(msgspec.structs.replace(rj, last_checkpoint=now))
        k = round((now - sj.ckpt_origin) / sj.ckpt_interval)  # on the grid exactly, not a running sum
        self._push(sj.ckpt_origin + (k + 1) * sj.ckpt_interval, CKPT, job_id, run_id)
        return False

    def _on_end(self, job_id: str, version: int, now: float) -> bool:
        sj = self.running.get(job_id)
        if sj is None or sj.attempt != version:
            return False  # stale: the run was preempted, failed or resized
        j = sj.job
        if j.kind == "service":
            return self._service_exit(sj, now)
        self._stop(sj, now, None)
        sj.remaining = 0.0
        self.holds.end(j, "completed")
        assert sj.first_start is not None
        self.records.append(
            JobRecord(
                id=j.id,
                team=j.team,
                priority=sj.pclass,
                submit=j.submit,
                start=sj.first_start,
                end=now,
                gpus=j.gpus,
                duration=j.duration,
                run_time=sj.run_time,
                preemptions=sj.preemptions,
                failures=sj.failures,
                lost_gpu_s=sj.lost_gpu_s,
                nodes=sj.nodes,
                racks=sj.racks,
                gpu_type=j.gpu_type,
                placed_gpu_type=sj.placed_type,
            )
        )
        return True

    def _service_exit(self, sj: _SimJob, now: float) -> bool:
        """A service's run ended (its ranks exited): never completed, it waits out the job controller's
        retry backoff, doubling with each exit, and is queued again in its original place."""
        self._stop(sj, now, None)
        sj.remaining = sj.job.duration  # a service has no progress to keep: each run is a fresh start
        retry = now + backoff_s(sj.restarts, self.opts.recovery)
        sj.restarts += 1
        sj.retry_at = (now, retry)
        self.restarts_due += 1
        self._push(retry, RESTART, sj.job.id)
        return True

    def _on_restart(self, job_id: str, now: float) -> bool:
        self.restarts_due -= 1
        self._enqueue(self.jobs[job_id], now)
        return True

    def _on_fail(self, node_id: str, now: float, version: int) -> bool:
        if node_id in self.down:
            return False
        faults = self.cluster.faults
        down_for = faults.repair_time
        if version < 0:
            ev = faults.events[-1 - version]
            down_for = ev.down_for if ev.down_for is not None else faults.repair_time
        self.down.add(node_id)
        self.model.set_schedulable(node_id, False)
        if node_id not in self.cordoned:  # a cordoned node's GPUs are already out of the healthy count
            self.healthy_gpus -= self.node_gpus[node_id]
        for jid in sorted(self.on_node[node_id]):
            sj = self.running[jid]
            self._stop(sj, now, self._checkpointed_progress(sj, now))
            sj.failures += 1
            sj.overhead_due = self.cluster.faults.checkpoint_overhead
            self._enqueue(sj, now)
        self._push(now + down_for, REPAIR, node_id, 1 if version < 0 else 0)
        return True

    def _on_repair(self, node_id: str, now: float, scripted: bool) -> bool:
        self.down.discard(node_id)
        if node_id not in self.cordoned:  # a cordoned node stays out until its cordon ends
            self.model.set_schedulable(node_id, True)
            self.healthy_gpus += self.node_gpus[node_id]
        mtbf = self.cluster.faults.node_mtbf
        if mtbf and not scripted:  # a scripted failure does not restart the node's random failure clock
            self._push(now + self.rng.expovariate(1.0 / mtbf), FAIL, node_id)
        return True

    # --- decisions -------------------------------------------------------------------------------

    def _cycle(self, now: float) -> bool:
        """One call of the core; apply what it decided. True when it stopped a victim (so GPUs were
        released that the core could not hand out in the same call)."""
        if self.holds.held or self.limits.arrays:  # the last call's binds and rejections may free some
            self._release_held(now)
        snap = ct.Snapshot(
            now=now,
            cluster=self.model,
            pending=tuple(sj.pending for sj in self.pending.values() if sj.pending is not None),
            queues=self.core_queues,
            priority_classes=self.core_classes,
            user_usage=self._user_usage(now),
        )
        d = self.schedule(snap, self.policy)
        self.cycles += 1
        stopped = False
        overhead = self.cluster.faults.checkpoint_overhead
        for p in d.preemptions:
            sj = self.running.get(p.victim_id)
            if sj is None:
                raise SimError(f"t={now}: core preempted {p.victim_id}, which is not running")
            self._stop(sj, now, None)
            sj.preemptions += 1
            sj.last_preempted = now
            sj.overhead_due = overhead
            self._enqueue(sj, now)
            stopped = True
        for r in d.resizes:
            sj = self.running.get(r.job_id)
            if sj is None:
                raise SimError(f"t={now}: core resized {r.job_id}, which is not running")
            # the whole new gang, renumbered as the scheduler's GangResized numbers it (the core names
            # the tasks of a later resize by these numbers)
            placements = resized_placements(self.model.running[r.job_id].placements, r)
            self._stop(sj, now, None)
            sj.overhead_due = overhead
            self._start(sj, now, r.gpus, placements)
            stopped |= bool(r.remove)
        for b in d.binds:
            sj = self.pending.get(b.job_id)
            if sj is None:
                raise SimError(f"t={now}: core bound {b.job_id}, which is not pending")
            milli = (
                b.placements[0].milli
                if b.placements and b.placements[0].milli is not None
                else sj.job.gpu_milli
            )
            busy = None if sj.job.mig_profile is not None else self._busy(b.placements, milli)
            if busy:
                if self.opts.strict:
                    raise SimError(f"t={now}: core bound {b.job_id} onto GPUs already taken ({busy})")
                self.bind_conflicts += 1
                stopped = True  # run the core again at this instant: it will place the job elsewhere
                continue
            self._dequeue(sj)
            self._start(sj, now, b.gpus, b.placements)
        # A gang the core says can never fit this cluster is rejected, as the scheduler service does
        # (JobRejected, on the same codes); left in the queue it would block a strict-order policy forever.
        for pr in d.pending:
            if pr.code in NEVER_FITS and pr.job_id in self.pending:
                sj = self.pending[pr.job_id]
                self._dequeue(sj)
                self._reject(pr.job_id)
                stopped = True
        return stopped

    def _user_usage(self, now: float) -> tuple[UserUsage, ...]:
        """The service of the waiting jobs' users, the rows the live bridge builds from its fold."""
        if not self.user_ledgers:
            return ()
        waiting = ((sj.job.team, sj.job.user) for sj in self.pending.values() if sj.pending is not None)
        return usage_rows(lambda team, user: self.user_ledgers.get((team, user)), waiting, now)

    def _busy(self, placements: tuple[ct.TaskPlacement, ...], gpu_milli: int | None = None) -> str | None:
        """The first GPU of ``placements`` that is not free (or repeated), as text; None if all are free. A
        fractional job (``gpu_milli``) may also take a GPU other shares hold with room left for its own."""
        seen: set[tuple[str, int]] = set()
        for p in placements:
            free = self.model.free_gpus(p.node_id) if p.node_id in self.node_gpus else ()
            for g in p.gpus:
                shared = self.model.shares.get((p.node_id, g))
                if gpu_milli is not None and shared is not None and shared + gpu_milli <= GPU_MILLI:
                    continue
                if g not in free or (p.node_id, g) in seen:
                    return f"{p.node_id} GPU {g}"
                seen.add((p.node_id, g))
        return None

    def _record(self, now: float) -> None:
        team_min = {t: min(c) for t, c in self.team_pending_sizes.items() if c}
        self.rec.step(
            now,
            self.allocated,
            len(self.pending),
            self.healthy_gpus - self.allocated,
            min(team_min.values(), default=0),
            self.pending_gpus,
            self.team_alloc,
            team_min,
        )

    def run(self, after_instant: Callable[[float], bool] | None = None) -> SimResult:
        """Replay the whole workload; ``after_instant`` (see :meth:`advance`) may watch each instant."""
        t_wall = time.perf_counter()
        self._seed_events()
        now = self.advance(after_instant)
        self.rec.finish(now)
        ended = {r.id for r in self.records} | set(self.rejected) | set(self.holds.failed)
        unfinished = sorted(set(self.jobs) - ended - self.service_ids)  # a service never finishes
        extra: dict[str, Any] = {
            "cycles": self.cycles,
            "unfinished": len(unfinished),
            "bind_conflicts": self.bind_conflicts,
            "rejected": len(self.rejected),
        }
        if self.has_holds:
            extra["dependency_failed"] = len(self.holds.failed)
        if self.service_ids:
            extra["services"] = len(self.service_ids)
            extra["service_restarts"] = sum(self.jobs[s].restarts for s in sorted(self.service_ids))
        if self.fs is not None:
            extra["failslow"] = self._failslow_summary()
        summary = summarize(
            self.records,
            self.rec,
            jobs=len(self.jobs),
            policy=self.policy_name,
            sim_wall_s=time.perf_counter() - t_wall,
            extra=extra,
        )
        return SimResult(self.records, summary, self.rec, self.cycles, unfinished)

    def advance(self, after_instant: Callable[[float], bool] | None = None) -> float:
        """Run the events in the heap, instant by instant, until none is left, the workload is done or
        stuck, ``until`` passes, or ``after_instant(now)`` (called once each instant has been decided)
        returns True; the instant it stopped at. A fork (sim/fork.py) advances from where it was taken."""
        heap = self.heap
        until = self.opts.until
        now = 0.0
        while heap:
            now = heap[0][0]
            if until is not None and now > until:
                now = until
                break
            dirty = False
            while heap and heap[0][0] == now:
                _, kind, _, key, version = heapq.heappop(heap)
                if kind == END:
                    dirty |= self._on_end(key, version, now)
                elif kind == SUBMIT:
                    dirty |= self._submit(self.jobs[key], now)
                elif kind == FAIL:
                    dirty |= self._on_fail(key, now, version)
                elif kind == REPAIR:
                    dirty |= self._on_repair(key, now, version == 1)
                elif kind == TICK:
                    if self._tick_at == now:
                        self._tick_at = None
                    dirty = True
                elif kind == SLOW_START:
                    dirty |= self._on_slow_start(key, version, now)
                elif kind == SLOW_END:
                    dirty |= self._on_slow_end(key, version, now)
                elif kind == DETECT:
                    dirty |= self._on_detect(key, version, now)
                elif kind == UNCORDON:
                    dirty |= self._on_uncordon(key, now)
                elif kind == CKPT:
                    dirty |= self._on_checkpoint(key, version, now)
                elif kind == SUSPEND:
                    dirty |= self._on_suspend(key, now)
                elif kind == RESUME:
                    dirty |= self._on_resume(key, now)
                elif kind == RESTART:
                    dirty |= self._on_restart(key, now)
            if self.holds.held or self.limits.arrays:
                dirty |= self._release_held(now)
            follow_up = False
            if dirty and (self.pending or self._has_elastic_running()):
                for _ in range(self.opts.max_cycles_per_instant):
                    # Run again at the same instant only when victims were just stopped: their GPUs are
                    # free now, and the core binds preemptors only once the GPUs are released.
                    if not self._cycle(now) or not self.pending:
                        break
                else:
                    follow_up = True
                    self._push(now + self.opts.follow_up_s, TICK, "")
            self._record(now)
            # Done when every job finished; or stuck: nothing runs, nothing is left to arrive and every node
            # is up, so no later event (only more failures) can make a waiting job fit.
            ended = len(self.records) + len(self.rejected) + len(self.holds.failed)
            if (
                ended == len(self.jobs)
                or self._only_services_left(ended)
                or (
                    not self.running
                    and not self.unsubmitted
                    and not self.down
                    and not self.cordoned
                    and self.pending
                    and not follow_up
                    and not self.resumes_due  # a resume to come may still change what fits
                    and not self.restarts_due  # so may a service's restart
                )
            ):
                break
            if self.tick and self.pending and self.running and self._tick_at is None:
                self._tick_at = now + self.tick
                self._push(self._tick_at, TICK, "")
            if after_instant is not None and after_instant(now):
                break
        return now

    def _only_services_left(self, ended: int) -> bool:
        """Every job but the services has ended: they would run on forever, so the run ends here."""
        if not self.service_ids or ended + len(self.service_ids) < len(self.jobs):
            return False
        done = {r.id for r in self.records} | set(self.rejected) | set(self.holds.failed)
        return all(job_id in done or job_id in self.service_ids for job_id in self.jobs)

    def _has_elastic_running(self) -> bool:
        return self.elastic_running > 0

    def _failslow_summary(self) -> dict[str, Any]:
        """What fail-slow cost, over every job (finished or not): slowness and replacement restarts."""
        jobs = self.jobs.values()
        return {
            "episodes": self.fs_counts["episodes"],
            "replacements": self.fs_counts["replacements"],
            "cordons": self.fs_counts["cordons"],
            "checks_not_flagged": self.fs_counts["checks_not_flagged"],
            "jobs_slowed": sum(1 for sj in jobs if sj.slow_gpu_s > 0),
            "jobs_replaced": sum(1 for sj in jobs if sj.replacements),
            "slow_gpu_hours": sum(sj.slow_gpu_s for sj in jobs) / 3600.0,
            "restart_gpu_hours": sum(sj.replace_lost_gpu_s for sj in jobs) / 3600.0,
        }


def simulate(
    jobs: Sequence[Job], cluster: Cluster, policy: str, queues: Queues | None = None, seed: int = 0, **kw: Any
) -> SimResult:
    return Simulator(jobs, cluster, policy, queues, SimOptions(seed=seed, **kw)).run()


def records_by_id(records: Sequence[JobRecord]) -> Mapping[str, JobRecord]:
    return {r.id: r for r in records}


def encode_record(r: JobRecord) -> bytes:
    return msgspec.json.encode(r)
