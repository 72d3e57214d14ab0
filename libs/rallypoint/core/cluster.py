"""The cluster model: topology, free GPUs and running jobs, kept incrementally by the caller.

Callers (simulator, scheduler service) own one :class:`ClusterModel` and update it as events arrive:
``add_node`` / ``set_schedulable`` for inventory and health, ``bind`` / ``unbind`` for gangs that start and
end. Each update is O(nodes touched). ``schedule()`` reads the model through :meth:`ClusterModel.index`,
copies the few flat arrays it mutates into a workspace (list copies, a fraction of a millisecond at 12,500
nodes) and never writes back.

Nodes are ordered by (spine, rack, node id): that order is the tie-break for every placement, so the
same set of nodes gives the same decisions whatever order they were added in.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left, insort
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rallypoint.core.formulas import add_team_usage
from rallypoint.core.mig import MigInstance, free_mask, mig_model
from rallypoint.core.types import CPU, MEMORY, SERVICE, Node, RunningJob, TaskPlacement
from rallypoint.core.units import running_milli
from rallypoint.events.catalogue import GPU_MILLI

__all__ = ["GPU_MILLI", "ClusterIndex", "ClusterModel", "RunningColumns", "load_cluster", "nodes_from_spec"]


class _Registry:
    """Append-only str -> small int, so per-job string attributes can live in numpy columns."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


class RunningColumns:
    """The running jobs as numpy columns (one slot per job) plus one row per task, kept by ``bind`` /
    ``unbind`` in O(tasks of the job) with swap-remove.

    The preemption planner needs every running job's rank, work lost and task locations each cycle;
    rebuilding that from ``ClusterModel.running`` cost a Python loop over every running job per cycle.
    Slot order depends on the bind/unbind history, so every consumer must sort by values (ties by job
    id), never rely on slot order.
    """

    def __init__(self) -> None:
        self.n = 0
        self.nt = 0
        self.ids: list[str] = []
        self.slot: dict[str, int] = {}
        self.rows_of: dict[str, list[int]] = {}
        self.classes = _Registry()
        self.gtypes = _Registry()
        self.queues = _Registry()
        cap = 16
        self.gpus = np.zeros(cap, np.int64)
        self.since = np.zeros(cap, np.float64)  # last checkpoint, else start: work since then is lost
        self.start = np.zeros(cap, np.float64)
        self.attained = np.zeros(cap, np.float64)
        self.cls = np.zeros(cap, np.int32)
        self.preemptible = np.zeros(cap, np.bool_)
        self.last_preempted = np.zeros(cap, np.float64)  # -inf: never preempted
        self.gtype = np.zeros(cap, np.int32)
        self.queue = np.zeros(cap, np.int32)
        self.stopping = np.zeros(cap, np.bool_)  # preempting_for is set
        self.elastic = np.zeros(cap, np.bool_)  # min_gpus set and above it (shrink candidate)
        self.exp_end = np.zeros(cap, np.float64)  # expected_end, NaN when unknown
        self.t_job = np.zeros(cap, np.int64)  # task row -> job slot
        self.t_node = np.zeros(cap, np.int64)  # task row -> stable node key
        self.t_gpus = np.zeros(cap, np.int64)
        # task row -> its place in ``rows_of[its job]``: a swap-remove re-points the moved row in O(1)
        # (a list search there made freeing a 2,500-node gang cost ~30 ms when the moved rows were a
        # gang as large)
        self.t_pos = np.zeros(cap, np.int64)

    _JOB_COLS = (
        "gpus", "since", "start", "attained", "cls", "preemptible", "last_preempted", "gtype", "queue",
        "stopping", "elastic", "exp_end",
    )  # fmt: skip
    _TASK_COLS = ("t_job", "t_node", "t_gpus", "t_pos")

    def _grow(self, names: tuple[str, ...], need: int) -> None:
        # the columns of a group always have one length (they grow together): most calls look once
        if len(getattr(self, names[0])) >= need:
            return
        for name in names:
            a = getattr(self, name)
            if len(a) < need:
                b = np.zeros(max(need, 2 * len(a)), a.dtype)
                b[: len(a)] = a
                setattr(self, name, b)

    def _fill(self, s: int, job: RunningJob, gtype: str) -> None:
        self.gpus[s] = job.gpus
        self.since[s] = job.last_checkpoint if job.last_checkpoint is not None else job.start_time
        self.start[s] = job.start_time
        self.attained[s] = job.attained_gpu_s
        self.cls[s] = self.classes(job.priority_class)
        self.preemptible[s] = job.preemptible
        self.last_preempted[s] = job.last_preempted_at if job.last_preempted_at is not None else -np.inf
        self.gtype[s] = self.gtypes(gtype)
        self.queue[s] = self.queues(job.queue_name)
        self.stopping[s] = job.preempting_for is not None
        self.elastic[s] = job.min_gpus is not None and job.gpus > job.min_gpus
        self.exp_end[s] = job.expected_end if job.expected_end is not None else np.nan

    def add(self, job: RunningJob, gtype: str, tasks: list[tuple[int, int]]) -> None:
        """``tasks``: (node key, GPU count) per task, in task order."""
        s = self.n
        self._grow(self._JOB_COLS, s + 1)
        self.ids.append(job.id)
        self.slot[job.id] = s
        self._fill(s, job, gtype)
        self.n = s + 1
        self._grow(self._TASK_COLS, self.nt + len(tasks))
        rows: list[int] = []
        for key, g in tasks:
            r = self.nt
            self.t_job[r] = s
            self.t_node[r] = key
            self.t_gpus[r] = g
            self.t_pos[r] = len(rows)
            rows.append(r)
            self.nt = r + 1
        self.rows_of[job.id] = rows

    def update(self, job: RunningJob, gtype: str) -> None:
        self._fill(self.slot[job.id], job, gtype)

    def remove(self, job_id: str) -> None:
        # task rows, highest first, so the row moved into a hole never belongs to this job
        for r in sorted(self.rows_of.pop(job_id), reverse=True):
            last = self.nt - 1
            if r != last:
                owner = self.ids[int(self.t_job[last])]
                for name in self._TASK_COLS:
                    a = getattr(self, name)
                    a[r] = a[last]
                self.rows_of[owner][int(self.t_pos[r])] = r
            self.nt = last
        s = self.slot.pop(job_id)
        last = self.n - 1
        if s != last:
            moved = self.ids[last]
            for name in self._JOB_COLS:
                a = getattr(self, name)
                a[s] = a[last]
            self.ids[s] = moved
            self.slot[moved] = s
            for r in self.rows_of[moved]:
                self.t_job[r] = s
        self.ids.pop()
        self.n = last


class ClusterIndex:
    """Flat, ordinal-indexed view of the topology plus the free-GPU bookkeeping.

    Per node ordinal ``o``: ``free[o]`` bitmask of free GPU indices, ``sched[o]`` schedulable flag,
    ``rack_of[o]`` / ``spine_of[o]`` indices, ``doms[o]`` NVLink-domain bitmasks. Aggregates count only
    schedulable nodes: ``buckets[type][c]`` sorted ordinals of nodes with exactly ``c`` free GPUs,
    ``rack_hist[(type, rack)][c]`` / ``spine_hist[(type, spine)][c]`` number of such nodes per rack/spine.
    """

    def __init__(self, nodes: list[Node]) -> None:
        nodes = sorted(nodes, key=lambda n: (n.spine, n.rack, n.id))
        self.nodes = nodes
        self.ids = [n.id for n in nodes]
        self.ord_of = {n.id: i for i, n in enumerate(nodes)}
        self.types: list[str] = sorted({n.gpu_type for n in nodes})
        self.type_of = [n.gpu_type for n in nodes]
        self.max_gpus = max((n.gpus for n in nodes), default=0)
        self.racks: list[str] = []
        self.spines: list[str] = []
        rack_idx: dict[tuple[str, str], int] = {}
        spine_idx: dict[str, int] = {}
        self.rack_of: list[int] = []
        self.spine_of: list[int] = []
        self.rack_nodes: list[list[int]] = []
        self.rack_spine: list[int] = []
        self.spine_racks: list[list[int]] = []
        for o, n in enumerate(nodes):
            s = spine_idx.get(n.spine)
            if s is None:
                s = spine_idx[n.spine] = len(self.spines)
                self.spines.append(n.spine)
                self.spine_racks.append([])
            r = rack_idx.get((n.spine, n.rack))
            if r is None:
                r = rack_idx[(n.spine, n.rack)] = len(self.racks)
                self.racks.append(n.rack)
                self.rack_nodes.append([])
                self.rack_spine.append(s)
                self.spine_racks[s].append(r)
            self.rack_of.append(r)
            self.spine_of.append(s)
            self.rack_nodes[r].append(o)
        # a GPU in MIG mode is never free for whole-GPU placement: its slices are ``core.sharing``'s
        self.full = [((1 << n.gpus) - 1) & ~sum(1 << g for g in n.mig_gpus) for n in nodes]
        self.doms: list[tuple[int, ...]] = []
        self.dom_size: list[int] = []  # largest NVLink domain of the node
        self.multi_dom: list[bool] = []
        for n in nodes:
            if n.nvlink_domains:
                masks = tuple(sum(1 << g for g in d) for d in n.nvlink_domains)
            else:
                masks = ((1 << n.gpus) - 1,)
            self.doms.append(masks)
            self.dom_size.append(max(m.bit_count() for m in masks))
            self.multi_dom.append(len(masks) > 1)
        # racks are contiguous ordinal ranges (nodes sorted by spine, rack, id): [rack_lo[r], rack_hi[r]);
        # a rack without multi-domain nodes has capacities exactly as its histogram says
        self.rack_lo = [ns[0] for ns in self.rack_nodes]
        self.rack_hi = [ns[-1] + 1 for ns in self.rack_nodes]
        self.rack_multi = [any(self.multi_dom[o] for o in ns) for ns in self.rack_nodes]
        self.free = list(self.full)
        # a tainted node is closed to every job here; a job that tolerates its taints opens it inside a
        # transaction (``Workspace.open_node``, ``core.constraints``)
        self.sched = [n.schedulable and not n.taints for n in nodes]
        self.tainted = [o for o, n in enumerate(nodes) if n.taints]
        self.ord_of_key: np.ndarray = np.zeros(0, np.int64)  # set by ClusterModel.index()
        self.rack_of_np = np.asarray(self.rack_of, np.int64)
        self.spine_of_np = np.asarray(self.spine_of, np.int64)
        width = self.max_gpus + 1
        self.buckets: dict[str, list[list[int]]] = {t: [[] for _ in range(width)] for t in self.types}
        self.rack_hist: dict[tuple[str, int], list[int]] = {}
        self.spine_hist: dict[tuple[str, int], list[int]] = {}
        # capacity of every node of a type / rack / spine, healthy or not (GangTooLarge vs NodeUnhealthy)
        self.type_capacity: dict[str, int] = {t: 0 for t in self.types}
        self.rack_capacity: dict[tuple[str, int], int] = {}
        self.spine_capacity: dict[tuple[str, int], int] = {}
        for o, n in enumerate(nodes):
            t = n.gpu_type
            self.rack_hist.setdefault((t, self.rack_of[o]), [0] * width)
            self.spine_hist.setdefault((t, self.spine_of[o]), [0] * width)
            whole = self.full[o].bit_count()  # GPUs not in MIG mode
            self.type_capacity[t] += whole
            rk = (t, self.rack_of[o])
            self.rack_capacity[rk] = self.rack_capacity.get(rk, 0) + whole
            sk = (t, self.spine_of[o])
            self.spine_capacity[sk] = self.spine_capacity.get(sk, 0) + whole
            if self.sched[o]:
                self._count(o, whole, +1)
        # per node ordinal: the position of its (type, rack) / (type, spine) histogram in rack_hist /
        # spine_hist (insertion order, which copies keep), so the bind path indexes a list of the histograms
        # instead of hashing a tuple key
        rpos = {k: i for i, k in enumerate(self.rack_hist)}
        spos = {k: i for i, k in enumerate(self.spine_hist)}
        self.rack_slot = [rpos[(t, r)] for t, r in zip(self.type_of, self.rack_of, strict=True)]
        self.spine_slot = [spos[(t, sp)] for t, sp in zip(self.type_of, self.spine_of, strict=True)]
        self.type_free: dict[str, int] = {t: 0 for t in self.types}
        for o in range(len(nodes)):
            if self.sched[o]:
                self.type_free[self.type_of[o]] += self.free[o].bit_count()
        # free GPUs per node ordinal, 0 for unschedulable nodes (a flat buffer numpy can view without a
        # copy: the preemption walk reads the free counts of thousands of candidate domains at once)
        self.fcount = array(
            "H", (f.bit_count() if ok else 0 for f, ok in zip(self.free, self.sched, strict=True))
        )
        self.type_np = np.asarray([self.types.index(t) for t in self.type_of] or [0], np.int64)[: len(nodes)]

    def max_capacity(self, gpu_type: str, level: str) -> int:
        """Largest capacity (healthy or not) of one domain at ``level`` for ``gpu_type``."""
        cache = self.__dict__.setdefault("_maxcap", {})
        key = (gpu_type, level)
        v = cache.get(key)
        if v is None:
            if level == "cluster":
                v = self.type_capacity.get(gpu_type, 0)
            elif level == "rack":
                v = max((c for (t, _r), c in self.rack_capacity.items() if t == gpu_type), default=0)
            elif level == "spine":
                v = max((c for (t, _s), c in self.spine_capacity.items() if t == gpu_type), default=0)
            else:
                v = max(
                    (
                        n.gpus if level == "node" else self.dom_size[o]
                        for o, n in enumerate(self.nodes)
                        if n.gpu_type == gpu_type
                    ),
                    default=0,
                )
            cache[key] = v
        return v

    def _count(self, o: int, c: int, sign: int) -> None:
        t = self.type_of[o]
        if sign > 0:
            insort(self.buckets[t][c], o)
        else:
            b = self.buckets[t][c]
            del b[bisect_left(b, o)]
        self.rack_hist[(t, self.rack_of[o])][c] += sign
        self.spine_hist[(t, self.spine_of[o])][c] += sign

    def set_free(self, o: int, mask: int) -> None:
        old = self.free[o]
        self.free[o] = mask
        if self.sched[o]:
            co, cn = old.bit_count(), mask.bit_count()
            if co != cn:
                self._count(o, co, -1)
                self._count(o, cn, +1)
                self.type_free[self.type_of[o]] += cn - co
                self.fcount[o] = cn

    def set_sched(self, o: int, flag: bool) -> None:
        if self.sched[o] == flag:
            return
        c = self.free[o].bit_count()
        self.sched[o] = flag
        self.__dict__.pop("_healthy_cap", None)
        self.__dict__.pop("_totals", None)
        self._count(o, c, +1 if flag else -1)
        self.type_free[self.type_of[o]] += c if flag else -c
        self.fcount[o] = c if flag else 0


class ClusterModel:
    """Mutable-by-the-caller cluster state; ``schedule()`` only reads it.

    Invariants kept by every method: a GPU is used by at most one running job; ``free`` masks and all
    aggregates agree with the running jobs' placements. ``bind`` raises ``ValueError`` on a double bind.
    """

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._nodes: dict[str, Node] = {}
        self.running: dict[str, RunningJob] = {}
        # the running elastic gangs (a ``max_gpus``): what ``ElasticGrower`` looks through every cycle,
        # instead of every running job (thousands at scale, nearly none of them elastic)
        self.elastic: dict[str, RunningJob] = {}
        # (queue, gpu_type) -> thousandths of a GPU in use (``core.units``; CPU / memory keys: millicores,
        # MiB; the service key: whole GPUs); team -> (GPU thousandths, cpu_milli, memory_mib) for DRF
        self.usage: dict[tuple[str, str], int] = {}
        self.team_usage: dict[str, tuple[int, int, int]] = {}
        self._used: dict[str, int] = {}  # node id -> used mask (survives index rebuilds)
        # (node id, GPU) -> thousandths of the GPU its fractional jobs hold (a GPU with any share is used)
        self.shares: dict[tuple[str, int], int] = {}
        # (node id, GPU) -> the ids of the fractional or MIG jobs on it, in bind order
        self.parts_on: dict[tuple[str, int], list[str]] = {}
        # (node id, GPU in MIG mode) -> its busy MIG instances (the slices its MIG jobs hold)
        self.mig_busy: dict[tuple[str, int], tuple[MigInstance, ...]] = {}
        # node id -> (CPU millicores, memory MiB) its running tasks asked for; nodes with none are absent
        self.node_cpu_mem_used: dict[str, tuple[int, int]] = {}
        # (team, affinity group) -> {running member's id: the nodes of its tasks} (``core.constraints``)
        self.group_nodes: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        # per running job: (node id, GPU mask) per task, and the jobs sorted by expected end, both kept at
        # bind time so reservations never rescan every running job
        self.job_masks: dict[str, tuple[tuple[str, int], ...]] = {}
        self.ends: list[tuple[float, str]] = []
        # numpy columns of the running jobs and their tasks (for vectorized preemption planning)
        self.cols = RunningColumns()
        self._node_key: dict[str, int] = {}  # stable small int per node id (task rows refer to nodes by it)
        self._index: ClusterIndex | None = None
        self.version = 0  # bumped on every change; lets callers cache derived data
        for n in nodes:
            self.add_node(n)

    # --- topology ------------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        """Add or replace a node (invalidates the index; rebuilt lazily, O(n log n))."""
        self._nodes[node.id] = node
        self._used.setdefault(node.id, 0)
        self._node_key.setdefault(node.id, len(self._node_key))
        self._index = None
        self.version += 1

    def set_schedulable(self, node_id: str, flag: bool) -> None:
        """Drain / lose (False) or recover (True) a node. Running jobs on it are the caller's business."""
        node = self._nodes[node_id]
        self._nodes[node_id] = msgspec.structs.replace(node, schedulable=flag)
        if self._index is not None:
            self._index.set_sched(self._index.ord_of[node_id], flag and not node.taints)
            self._index.nodes[self._index.ord_of[node_id]] = self._nodes[node_id]
        self.version += 1

    @property
    def nodes(self) -> dict[str, Node]:
        return self._nodes

    def index(self) -> ClusterIndex:
        if self._index is None:
            idx = ClusterIndex(list(self._nodes.values()))
            for nid, used in sorted(self._used.items()):
                if used:
                    o = idx.ord_of[nid]
                    idx.set_free(o, idx.full[o] & ~used)
            # node key -> ordinal, so task rows (by stable key) map to this index's ordinals in one take
            ok = np.zeros(len(self._node_key), np.int64)
            for nid, k in self._node_key.items():
                ok[k] = idx.ord_of[nid]
            idx.ord_of_key = ok
            self._index = idx
        return self._index

    def free_gpus(self, node_id: str) -> tuple[int, ...]:
        node = self._nodes[node_id]
        used = self._used.get(node_id, 0)
        return tuple(g for g in range(node.gpus) if not used >> g & 1 and g not in node.mig_gpus)

    # --- jobs ----------------------------------------------------------------------------------

    def bind(self, job: RunningJob) -> None:
        """Register a running gang and take its GPUs (and its tasks' CPU and memory on their nodes)."""
        if job.id in self.running:
            raise ValueError(f"job {job.id} already running")
        if job.gpu_milli is not None:
            self._bind_share(job)
            return
        if job.mig_profile is not None:
            self._bind_mig(job)
            return
        masks: dict[str, int] = {}
        for p in job.placements:
            node = self._nodes.get(p.node_id)
            if node is None:
                raise ValueError(f"job {job.id}: unknown node {p.node_id}")
            m = 0
            for g in p.gpus:
                if not 0 <= g < node.gpus or g in node.mig_gpus:
                    raise ValueError(f"job {job.id}: node {p.node_id} has no whole GPU {g}")
                m |= 1 << g
            if m & masks.get(p.node_id, 0) or m & self._used.get(p.node_id, 0):
                raise ValueError(f"job {job.id}: GPU already bound on {p.node_id}")
            masks[p.node_id] = masks.get(p.node_id, 0) | m
        for nid, m in masks.items():
            self._set_used(nid, self._used[nid] | m)
        self._set_running(job)
        self.job_masks[job.id] = tuple((p.node_id, sum(1 << g for g in p.gpus)) for p in job.placements)
        if job.expected_end is not None:
            insort(self.ends, (job.expected_end, job.id))
        self._account(job, +1)
        nk = self._node_key
        self.cols.add(job, self.job_gpu_type(job), [(nk[p.node_id], len(p.gpus)) for p in job.placements])
        self.version += 1

    def _bind_share(self, job: RunningJob) -> None:
        """A fractional job: its one GPU leaves the free ones while any share of it is bound. It holds no
        mask and no expected end (its end frees no whole GPU while others share it, so reservation
        arithmetic never counts on it) and is never a preemption victim (evicting it frees no whole GPU
        either; ``docs/sharing.md``)."""
        p = self._one_gpu(job)
        g = p.gpus[0]
        if g in self._nodes[p.node_id].mig_gpus:
            raise ValueError(f"job {job.id}: GPU {g} of {p.node_id} is in MIG mode")
        key = (p.node_id, g)
        used = self.shares.get(key)
        assert job.gpu_milli is not None
        if used is None and self._used[p.node_id] >> g & 1:
            raise ValueError(f"job {job.id}: GPU {g} of {p.node_id} is bound whole")
        if (used or 0) + job.gpu_milli > GPU_MILLI:
            raise ValueError(f"job {job.id}: GPU {g} of {p.node_id} has {GPU_MILLI - (used or 0)} milli left")
        self.shares[key] = (used or 0) + job.gpu_milli
        self._set_used(p.node_id, self._used[p.node_id] | 1 << g)
        self._register_part(job, p.node_id)

    def _bind_mig(self, job: RunningJob) -> None:
        """A MIG job: its slice joins its GPU's busy instances. Like a share it holds no mask and no
        expected end and is never a victim (``_bind_share``)."""
        p = self._one_gpu(job)
        node = self._nodes[p.node_id]
        g = p.gpus[0]
        model = mig_model(node.gpu_type)
        if p.mig is None or g not in node.mig_gpus or model is None:
            raise ValueError(f"job {job.id}: a MIG job holds a slice of a MIG GPU, got {p}")
        offered = {q.name: q for q in model.profiles}.get(p.mig.profile)
        if offered is None or p.mig.start not in offered.starts:
            raise ValueError(f"job {job.id}: {node.gpu_type} has no {p.mig.profile} slice at {p.mig.start}")
        key = (p.node_id, g)
        busy = self.mig_busy.get(key, ())
        if offered.mask_at(p.mig.start) & ~free_mask(model, busy):
            raise ValueError(f"job {job.id}: slice {p.mig} of GPU {g} of {p.node_id} overlaps another")
        self.mig_busy[key] = (*busy, MigInstance(p.mig.profile, p.mig.start, True))
        self._register_part(job, p.node_id)

    def _register_part(self, job: RunningJob, node_id: str) -> None:
        """A share or slice is running: no GPU mask of its own (its GPU is its parts'), and never chosen
        as a victim by the whole-GPU planner (``core.part_preemption`` evicts shares and slices)."""
        self.parts_on.setdefault((node_id, job.placements[0].gpus[0]), []).append(job.id)
        self._set_running(job)
        self.job_masks[job.id] = ()
        self._account(job, +1)
        victimless = msgspec.structs.replace(job, preemptible=False)
        self.cols.add(victimless, self.job_gpu_type(job), [(self._node_key[node_id], 1)])
        self.version += 1

    def _one_gpu(self, job: RunningJob) -> TaskPlacement:
        if len(job.placements) != 1 or len(job.placements[0].gpus) != 1:
            raise ValueError(f"job {job.id}: holds exactly one GPU (or a slice of one) of one node")
        p = job.placements[0]
        node = self._nodes.get(p.node_id)
        if node is None:
            raise ValueError(f"job {job.id}: unknown node {p.node_id}")
        if not 0 <= p.gpus[0] < node.gpus:
            raise ValueError(f"job {job.id}: node {p.node_id} has no GPU {p.gpus[0]}")
        return p

    def _set_running(self, job: RunningJob) -> None:
        self.running[job.id] = job
        if job.max_gpus is not None:
            self.elastic[job.id] = job

    def unbind(self, job_id: str) -> RunningJob:
        """Remove a running gang (completed, failed, preempted) and free its GPUs."""
        job = self.running.pop(job_id)
        self.elastic.pop(job_id, None)
        for nid, m in self.job_masks.pop(job_id):
            self._set_used(nid, self._used[nid] & ~m)
        if job.gpu_milli is not None or job.mig_profile is not None:
            key = (job.placements[0].node_id, job.placements[0].gpus[0])
            self.parts_on[key].remove(job_id)
            if not self.parts_on[key]:
                del self.parts_on[key]
        if job.gpu_milli is not None:
            self._unbind_share(job)
        if job.mig_profile is not None:
            self._unbind_mig(job)
        if job.expected_end is not None and job.gpu_milli is None and job.mig_profile is None:
            self._drop_end(job.expected_end, job_id)
        self._account(job, -1)
        self.cols.remove(job_id)
        self.version += 1
        return job

    def _unbind_mig(self, job: RunningJob) -> None:
        p = job.placements[0]
        assert p.mig is not None
        key = (p.node_id, p.gpus[0])
        left = list(self.mig_busy[key])
        left.remove(MigInstance(p.mig.profile, p.mig.start, True))
        if left:
            self.mig_busy[key] = tuple(left)
        else:
            del self.mig_busy[key]

    def _unbind_share(self, job: RunningJob) -> None:
        assert job.gpu_milli is not None
        p = job.placements[0]
        key = (p.node_id, p.gpus[0])
        left = self.shares[key] - job.gpu_milli
        if left:
            self.shares[key] = left
        else:
            del self.shares[key]
            self._set_used(p.node_id, self._used[p.node_id] & ~(1 << p.gpus[0]))

    def update_running(self, job: RunningJob) -> None:
        """Replace a running job's record (checkpoint time, expected end); placements and size must match.
        Use unbind + bind for a resize."""
        old = self.running[job.id]
        if old.placements != job.placements or old.gpus != job.gpus:
            raise ValueError("update_running cannot change placements; unbind and bind instead")
        if old.expected_end is not None:
            self._drop_end(old.expected_end, old.id)
        if job.expected_end is not None:
            insort(self.ends, (job.expected_end, job.id))
        self._set_running(job)
        self.cols.update(job, self.job_gpu_type(job))
        self.version += 1

    def _drop_end(self, end: float, job_id: str) -> None:
        i = bisect_left(self.ends, (end, job_id))
        del self.ends[i]

    def _set_used(self, node_id: str, used: int) -> None:
        self._used[node_id] = used
        if self._index is not None:
            o = self._index.ord_of[node_id]
            self._index.set_free(o, self._index.full[o] & ~used)

    def _account(self, job: RunningJob, sign: int) -> None:
        gt = job.gpu_type
        if gt is None:
            gt = self._nodes[job.placements[0].node_id].gpu_type if job.placements else "default"
        key = (job.queue_name, gt)
        milli = sign * running_milli(job)  # GPU quota and DRF count thousandths of a GPU (``core.units``)
        self.usage[key] = self.usage.get(key, 0) + milli
        tu = self.team_usage
        tasks = len(job.placements)
        cpu, mem = job.cpu_milli, job.memory_mib
        add_team_usage(tu, job.team, milli, sign * cpu * tasks, sign * mem * tasks)
        for resource, amount in ((CPU, cpu), (MEMORY, mem)):
            if amount:  # quota usage of the resources beside GPUs (``quota.CPU`` / ``MEMORY``)
                rkey = (job.queue_name, resource)
                self.usage[rkey] = self.usage.get(rkey, 0) + sign * amount * tasks
        if job.service:  # the room its queue reserves for services (``Queue.service_gpus``)
            skey = (job.queue_name, SERVICE)
            self.usage[skey] = self.usage.get(skey, 0) + sign * job.gpus
        for group in job.affinity_groups:
            self._join_group(job, group, sign)
        if cpu or mem:
            for p in job.placements:
                c, m = self.node_cpu_mem_used.get(p.node_id, (0, 0))
                c, m = c + sign * cpu, m + sign * mem
                if c or m:
                    self.node_cpu_mem_used[p.node_id] = (c, m)
                else:
                    del self.node_cpu_mem_used[p.node_id]

    def _join_group(self, job: RunningJob, group: str, sign: int) -> None:
        key = (job.team, group)
        members = self.group_nodes.setdefault(key, {})
        if sign > 0:
            members[job.id] = tuple(p.node_id for p in job.placements)
            return
        members.pop(job.id, None)
        if not members:
            del self.group_nodes[key]

    def job_gpu_type(self, job: RunningJob) -> str:
        if job.gpu_type is not None:
            return job.gpu_type
        return self._nodes[job.placements[0].node_id].gpu_type if job.placements else "default"


# ---------------------------------------------------------------------------------------------------
# Loading a topology from a file
# ---------------------------------------------------------------------------------------------------


def nodes_from_spec(spec: dict[str, Any]) -> list[Node]:
    """Build nodes from a topology description (already parsed JSON/YAML).

    Two forms, mixable: an explicit ``nodes: [{id, rack, spine, gpu_type, gpus, nvlink_domains, ...}]``
    list, and generated ``spines: [{name, racks: N, nodes_per_rack: M, gpus_per_node: G, gpu_type,
    nvlink_domains: [[0,1,2,3],[4,5,6,7]], cpu_milli, memory_mib}]`` blocks. Generated names are
    ``<spine>-r<k>`` for racks and ``<rack>-n<k>`` for nodes (zero padded).
    """
    out: list[Node] = [msgspec.convert(n, Node) for n in spec.get("nodes", [])]
    for sp in spec.get("spines", []):
        name = sp["name"]
        racks, per_rack = int(sp.get("racks", 1)), int(sp.get("nodes_per_rack", 1))
        doms = tuple(tuple(d) for d in sp.get("nvlink_domains", ()))
        for r in range(racks):
            rack = f"{name}-r{r:03d}"
            for k in range(per_rack):
                out.append(
                    Node(
                        id=f"{rack}-n{k:03d}",
                        rack=rack,
                        spine=name,
                        gpu_type=sp.get("gpu_type", "default"),
                        gpus=int(sp.get("gpus_per_node", 8)),
                        nvlink_domains=doms,
                        cpu_milli=int(sp.get("cpu_milli", 0)),
                        memory_mib=int(sp.get("memory_mib", 0)),
                    )
                )
    return out


def load_cluster(path: str | Path) -> ClusterModel:
    """Load a topology file (.json, or .yaml/.yml) into an empty ClusterModel."""
    p = Path(path)
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml  # only the loader needs it; the core itself stays stdlib + msgspec

        spec = yaml.safe_load(text)
    else:
        spec = json.loads(text)
    return ClusterModel(nodes_from_spec(spec))
