"""Per-cycle state shared by the plug-ins: the workspace, priorities, quotas, usage, holds, memos."""

from __future__ import annotations

from typing import NamedTuple

from rallypoint.core.config import PolicyConfig
from rallypoint.core.formulas import add_team_usage, dominant_share, job_types
from rallypoint.core.placement import Plan, level_rank, lowest_bits, place, plan_of
from rallypoint.core.quota import QuotaBook
from rallypoint.core.types import PendingJob, RunningJob, Snapshot
from rallypoint.core.units import GPU_MILLI
from rallypoint.core.workspace import Hold, Workspace

__all__ = ["Ctx", "Hold", "Status", "new_status"]

_NO_USAGE = (0, 0, 0)


class Status(NamedTuple):
    """Outcome of a plug-in for one job (Kubernetes framework style): a reason code and a message."""

    code: str
    message: str
    earliest_start: float | None = None


def new_status(code: str, message: str) -> Status:
    """``Status(code, message)`` without the Python-level ``__new__`` that ``NamedTuple`` generates (a
    waiting job's reason is rebuilt after most binds: thousands per cycle)."""
    return _tuple_new(Status, (code, message, None))


_tuple_new = tuple.__new__


class Ctx:
    def __init__(self, snap: Snapshot, cfg: PolicyConfig) -> None:
        self.snap = snap
        self.now = snap.now
        self.cfg = cfg
        # without it, required_level(job) is job.topology_required (the engine skips the call then)
        self.consolidate_small = cfg.consolidate_small
        self.cluster = snap.cluster
        self.ws = Workspace(snap.cluster)
        self.idx = self.ws.idx
        self._first_fit = cfg.first_fit  # (read by ``place`` for every job)
        self._max_gpus = self.idx.max_gpus
        self._multi_dom = self.idx.multi_dom
        self.prio = {pc.name: pc.value for pc in snap.priority_classes}
        self.class_preemptible = {pc.name: pc.preemptible for pc in snap.priority_classes}
        self.quota = QuotaBook(snap.queues if cfg.quotas else ())
        self.team_usage: dict[str, tuple[int, int, int]] = dict(snap.cluster.team_usage)
        self.weights = {q.name: q.weight for q in snap.queues}
        # Written through the workspace's journal (``ws.put`` / ``ws.bump``), so a rollback undoes them:
        # victim id -> preemptor id (this cycle's, and still stopping)
        self.preempted: dict[str, str] = {}
        # (queue, GPU type) -> GPUs being evicted (victims chosen this cycle or still stopping): they no
        # longer count as a queue's borrowing when deciding whether to reclaim more from it
        self.evicted: dict[tuple[str, str], int] = {}
        # per-cycle budgets used so far: "reservations", "preemptors" (planned), "consolidations" (tried)
        self.counts: dict[str, int] = {"reservations": 0, "preemptors": 0, "consolidations": 0}
        # preemptor id -> its victims still stopping (RunningJob.preempting_for), from the snapshot
        self.stopping: dict[str, list[str]] = {}
        # jobs their quota refused this cycle: whatever their reason names, they wait for quota, which
        # does not keep elastic gangs from growing into idle GPUs (``ElasticGrower``)
        self.quota_blocked: set[str] = set()
        # the workspace's holds (read here; changed only through ``ws.add_hold`` / ``set_hold`` /
        # ``remove_hold``, journaled) and every job id given a hold this cycle (``hold_of``'s fast miss)
        self.holds: list[Hold] = self.ws.holds
        self.hold_ids: set[str] = self.ws.hold_ids
        self.cycle_ends: list[tuple[float, str, tuple[tuple[int, int], ...]]] = []
        self._memo: dict[tuple[str | None, int, str | None], tuple[int, int]] = {}
        self._totals: tuple[int, int, int] | None = None
        self._healthy: dict[tuple[str, str], int] | None = None
        self._shares: dict[str, float] = {}
        # memos keyed by job shape, stamped with the workspace state they were computed on
        # (shape) -> (free total or workspace version, hold changes, status)
        # (a job allowing several GPU types is keyed by its gpu_types tuple)
        self._reasons: dict[
            tuple[str | tuple[str, ...] | None, int, int, int, str | None], tuple[int, int, Status]
        ] = {}
        self._probe_memo: dict[tuple[str | None, int, str | None], tuple[int, int, int]] = {}
        self._held_until: tuple[int, float] = (-1, 0.0)
        self.static_reasons: dict[tuple[str | tuple[str, ...] | None, int, int, str], Status | None] = {}
        # formulas.job_types of a job without gpu_types, per gpu_type (shared lists: read only)
        self.types_of: dict[str | None, list[str]] = {}
        self.cache: dict[str, object] = {}  # per-cycle memo for plug-ins (e.g. preemption rows)

    # --- journaled state, read-only views ----------------------------------------------------------

    @property
    def hold_changes(self) -> int:
        """A stamp that changes whenever the holds change (``Workspace.hold_changes``)."""
        return self.ws.hold_changes

    @property
    def reservations(self) -> int:
        return self.counts["reservations"]

    @property
    def preemptors(self) -> int:
        return self.counts["preemptors"]

    @property
    def consolidations(self) -> int:
        return self.counts["consolidations"]

    # --- small lookups ---------------------------------------------------------------------------

    def job_types(self, job: PendingJob) -> list[str]:
        """The GPU types ``job`` may bind on, in the order to try them: its ``gpu_types`` that the cluster
        has (in the job's order, first occurrence), else ``[gpu_type]`` (even when the cluster lacks it:
        the capacity check says so), else every type of the cluster."""
        return job_types(job, self.idx)

    def prio_of(self, job: PendingJob | RunningJob) -> int:
        return self.prio.get(job.priority_class, 0)

    def totals(self) -> tuple[int, int, int]:
        """Cluster capacity (GPU thousandths, CPU milli, memory MiB) of schedulable nodes, for DRF shares
        (cached on the index until a node's health changes: it is an O(nodes) sum)."""
        if self._totals is None:
            cached = self.idx.__dict__.get("_totals")
            if cached is None:
                g = c = m = 0
                for o, n in enumerate(self.idx.nodes):
                    if self.ws.sched[o]:
                        g += n.gpus * GPU_MILLI  # as team usage counts them (``core.units``)
                        c += n.cpu_milli
                        m += n.memory_mib
                cached = self.idx.__dict__["_totals"] = (max(g, 1), max(c, 1), max(m, 1))
            self._totals = cached
        return self._totals

    def dominant_share(self, team: str) -> float:
        # memoized: the DRF orderer asks for a team's share at every pop, usage changes only on a bind
        v = self._shares.get(team)
        if v is None:
            v = self._shares[team] = dominant_share(
                self.team_usage.get(team, _NO_USAGE), self.totals(), self.weight_div(team)
            )
        return v

    def weight_div(self, team: str) -> float:
        """The divisor of ``team``'s dominant share: its DRF weight, at least 1e-9."""
        return max(self.weights.get(team, 1.0), 1e-9)

    def add_team_usage(self, team: str, gpus: int, cpu_milli: int, memory_mib: int) -> None:
        add_team_usage(self.team_usage, team, gpus, cpu_milli, memory_mib)
        self._shares.pop(team, None)

    def healthy_capacity(self, gpu_type: str, level: str) -> int:
        """Largest schedulable capacity (free or not) of one domain at ``level`` for ``gpu_type``."""
        if self._healthy is None:
            # cached on the index until a node's health changes (set_sched clears it)
            cached = self.idx.__dict__.get("_healthy_cap")
            if cached is not None:
                self._healthy = cached
                return cached.get((gpu_type, level), 0)
            h: dict[tuple[str, str], int] = {}
            racks: dict[tuple[str, int], int] = {}
            spines: dict[tuple[str, int], int] = {}
            for o, n in enumerate(self.idx.nodes):
                if not self.ws.sched[o]:
                    continue
                t = n.gpu_type
                h[(t, "node")] = max(h.get((t, "node"), 0), n.gpus)
                h[(t, "nvlink")] = max(h.get((t, "nvlink"), 0), self.idx.dom_size[o])
                rk = (t, self.idx.rack_of[o])
                racks[rk] = racks.get(rk, 0) + n.gpus
                sk = (t, self.idx.spine_of[o])
                spines[sk] = spines.get(sk, 0) + n.gpus
                h[(t, "cluster")] = h.get((t, "cluster"), 0) + n.gpus
            for (t, _r), v in racks.items():
                h[(t, "rack")] = max(h.get((t, "rack"), 0), v)
            for (t, _s), v in spines.items():
                h[(t, "spine")] = max(h.get((t, "spine"), 0), v)
            self._healthy = h
            self.idx.__dict__["_healthy_cap"] = h
        return self._healthy.get((gpu_type, level), 0)

    def total_capacity(self, gpu_type: str, level: str) -> int:
        """Largest capacity of one domain at ``level``, counting unhealthy nodes too (cached per
        topology in the index: it only changes when nodes are added)."""
        return self.idx.max_capacity(gpu_type, level)

    # --- placement with a failure memo -------------------------------------------------------------

    def place(self, tasks: int, gpt: int, gpu_type: str | None, required: str | None) -> Plan | None:
        """``placement.place`` plus a memo: while no GPU was released in this cycle, a gang of at least
        as many tasks of the same shape that failed before fails again (free capacity only shrinks)."""
        key = (gpu_type, gpt, required)
        ws = self.ws
        epoch = ws.release_epoch
        m = self._memo.get(key)
        if m is not None and m[0] == epoch and tasks >= m[1]:
            return None
        if tasks == 1 and gpu_type is not None and not self._first_fit:
            # ``placement.place``'s fast path for one task of a given type (most binds), without the call
            # chain: the first non-empty bucket's first node, when it has a single NVLink domain
            bs = ws.buckets.get(gpu_type)
            if bs is not None and ws.type_free[gpu_type] >= gpt and gpt <= self._max_gpus:
                for c in range(gpt, len(bs)):
                    b = bs[c]
                    if b:
                        o1 = b[0]
                        if not self._multi_dom[o1]:
                            f = ws.free[o1]
                            # exactly gpt free GPUs: the task takes them all (no bit search)
                            return plan_of(
                                (gpu_type, "nvlink", ((o1, f if c == gpt else lowest_bits(f, gpt)),))
                            )
                        break
        plan = place(ws, tasks, gpt, gpu_type, required, self._first_fit)
        if plan is None:
            best = tasks if m is None or m[0] != epoch else min(tasks, m[1])
            self._memo[key] = (epoch, best)
        return plan

    def required_level(self, job: PendingJob) -> str | None:
        if self.cfg.consolidate_small and job.gpus <= self.idx.max_gpus:
            r = job.topology_required
            if r is None or level_rank(r) > level_rank("node"):
                return "node"
        return job.topology_required

    def held_until(self) -> float:
        """Shadow time of the holds a short job may backfill onto (strict preemption holds excluded)."""
        c = self._held_until
        stamp = self.ws.hold_changes
        if c[0] != stamp:
            c = self._held_until = (
                stamp,
                min((h.until for h in self.holds if not h.strict), default=float("inf")),
            )
        return c[1]

    def hold_of(self, job_id: str) -> Hold | None:
        if job_id not in self.hold_ids:
            return None
        for h in self.holds:
            if h.job_id == job_id:
                return h
        return None
