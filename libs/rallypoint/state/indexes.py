"""What the fold's readers ask for on every request, kept up to date as events arrive.

The API validates each submission against the cluster's GPU total and its largest node, the scheduler and
the API list pending jobs in arrival order: answering those by scanning every node or every job made each
request cost grow with the cluster. ``StateIndex`` keeps them current instead: ``ClusterState.apply``
tells it which job and which nodes an event may have changed, and only those are looked at again.

It is a cache, not state: it lives outside ``ClusterState``'s serialized fields (in the instance's
``__dict__``), so the hash, the snapshots and the fold version never see it, and a state restored from a
snapshot (or copied) builds it afresh from its jobs and nodes on first use.

It is settled when read, not as events arrive: ``note`` marks what an event may have changed, and a
reader's first question after it refiles the marked jobs (``settle_jobs``) or nodes (``settle_nodes``).
Every service folds every event, but most read the index far less often than events come (the job
controller, the checkpoint service, the predictor, the inventory between their queries; the scheduler
once a cycle): refiling on every event cost ~40 % of a fold (a job is submitted, bound and started
between two of their reads, and was refiled three times). A fold nobody reads settles whenever
``UNSETTLED_LIMIT`` marks have piled up, so its first reader never waits for a whole history.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from .cluster import JobView, NodeView

# Job classes a reader lists in arrival order (bits of one mask per job).
PENDING = 1  # waiting for a bind, not being cancelled
REPAIRING = 2  # an interrupted gang waiting for a replacement node, not being cancelled
GROWABLE = 4  # a launched elastic gang below its max_gpus, not being cancelled: the scheduler may grow it
_CLASSES = (PENDING, REPAIRING, GROWABLE)


class Touched(msgspec.Struct, frozen=True, gc=False):
    """What one applied event may have changed: its job, and the nodes whose view it may have changed (its
    own node, and the nodes of its job's placements before and after, since a bind or a release changes
    their allocations)."""

    job_id: str | None
    node_ids: frozenset[str]
    #: the jobs of an event that stands for several (``GangsBound``'s binds), beside ``job_id``
    more_jobs: frozenset[str] = frozenset()


NOTHING = Touched(job_id=None, node_ids=frozenset())

#: Marked jobs and nodes a fold keeps before it settles them unread: bounds the work of a first read (a
#: standby scheduler taking over) at ~1-2 ms.
UNSETTLED_LIMIT = 1024


def job_classes(job: JobView) -> int:
    """The reader classes ``job`` belongs to, as a mask of PENDING, REPAIRING and GROWABLE."""
    if job.cancel_requested or job.suspend_requested:
        return 0  # on its way out of the queue: nothing binds or grows it
    if job.state == "pending":
        return PENDING
    if job.state == "repairing":
        return REPAIRING
    return GROWABLE if _growable(job) else 0


def _growable(job: JobView) -> bool:
    limit = job.spec.max_gpus
    return limit is not None and job.state in ("bound", "running") and job.bound_gpus < limit


def node_share(node: NodeView) -> tuple[int, int, int]:
    """One node's part of the totals: (GPUs, GPUs if schedulable, free GPUs if schedulable)."""
    count = node.gpu_count
    if not node.schedulable:
        return count, 0, 0
    return count, count, len(node.free_gpus())


# (submitted_seq, first-seen ordinal): the ordinal keeps jobs of equal submitted_seq (only in a hand-built
# state) in the jobs dict's order, exactly as the stable sort the readers used to run.
_Key = tuple[int, int]


_UNFILED: tuple[int, _Key | None] = (0, None)


class _Ordered:
    """One class's jobs in arrival order: sorted keys, and the views at the same positions (the answer a
    reader copies, so a read costs a list copy, not a walk)."""

    def __init__(self) -> None:
        self.keys: list[_Key] = []
        self.views: list[JobView] = []

    def add(self, key: _Key, job: JobView) -> None:
        at = bisect.bisect_left(self.keys, key)
        self.keys.insert(at, key)
        self.views.insert(at, job)

    def remove(self, key: _Key) -> None:
        at = bisect.bisect_left(self.keys, key)
        del self.keys[at]
        del self.views[at]


class StateIndex:
    """Per-class job lists ordered by arrival, and node totals, for one ClusterState.

    It follows what ``ClusterState.apply`` changes (the fold mutates its views in place and never
    replaces one); a state edited by hand must drop it (``ClusterState.reindex``).
    """

    def __init__(self, jobs: Mapping[str, JobView], nodes: Mapping[str, NodeView]) -> None:
        self._ordinals = itertools.count()
        self._jobs: dict[str, tuple[int, _Key]] = {}  # job id -> (class mask, its key in the lists)
        self._ordered: dict[int, _Ordered] = {bit: _Ordered() for bit in _CLASSES}
        # Pending jobs by team, and each pending job's team: the API's fair-use cap reads the count on
        # every submission of a capped team, which a walk of the whole queue would make cost its length.
        self._pending_by_team: Counter[str] = Counter()
        self._pending_team: dict[str, str] = {}
        # Pending jobs waiting out a retry backoff (few): "ready at now" is every pending job once now is
        # past the latest of theirs.
        self._retrying: dict[str, float] = {}
        # Pending jobs with dependencies or a singleton flag (gated: each is ready only once they are met),
        # the gated jobs waiting on each job, and the live jobs of each (team, name) by arrival (singletons).
        self._gated: dict[str, JobView] = {}
        self._dependents: dict[str, set[str]] = {}
        self._live_named: dict[tuple[str, str], dict[str, int]] = {}
        self._array_live: dict[str, dict[str, JobView]] = {}  # throttled arrays' live members
        self._shares: dict[str, tuple[int, int, int]] = {}
        self._sizes: Counter[int] = Counter()  # GPUs per node -> how many nodes have that many
        self.total = self.schedulable = self.free = 0
        # What applied events may have changed since a reader last asked, in the order events first
        # touched them (dicts, not sets: a settle files new jobs in the log's order).
        self._unsettled_jobs: dict[str, None] = {}
        self._unsettled_nodes: dict[str, None] = {}
        for job in jobs.values():
            self.refresh_job(job.job_id, job)
        for node_id, node in nodes.items():
            self.refresh_node(node_id, node)

    # -- settling -----------------------------------------------------------------------------------

    def note(self, touched: Touched) -> bool:
        """Mark what one applied event may have changed; True once so much is marked that the fold
        should settle it now (``UNSETTLED_LIMIT``)."""
        if touched.job_id is not None:
            self._unsettled_jobs[touched.job_id] = None
        for node_id in touched.node_ids:
            self._unsettled_nodes[node_id] = None
        return len(self._unsettled_jobs) + len(self._unsettled_nodes) >= UNSETTLED_LIMIT

    def settle_jobs(self, jobs: Mapping[str, JobView]) -> None:
        """Refile every marked job as ``jobs`` holds it now (a job no longer there leaves the lists)."""
        if self._unsettled_jobs:
            marked, self._unsettled_jobs = self._unsettled_jobs, {}
            for job_id in marked:
                self.refresh_job(job_id, jobs.get(job_id))

    def settle_nodes(self, nodes: Mapping[str, NodeView]) -> None:
        """Replace every marked node's part of the totals with its current one."""
        if self._unsettled_nodes:
            marked, self._unsettled_nodes = self._unsettled_nodes, {}
            for node_id in marked:
                self.refresh_node(node_id, nodes.get(node_id))

    # -- jobs ---------------------------------------------------------------------------------------

    def refresh_job(self, job_id: str, job: JobView | None) -> None:
        """Re-file ``job_id`` after an event that may have changed it (None: no such job)."""
        old_mask, key = self._jobs.get(job_id, _UNFILED)
        new_mask = job_classes(job) if job is not None else 0
        if job is not None:
            self._file_gates(job, pending=bool(new_mask & PENDING))
        if old_mask == new_mask == 0:
            return  # most events: a running or finished job stays out of every list
        if new_mask & PENDING and job is not None and job.retry_at is not None:
            self._retrying[job_id] = job.retry_at
        elif old_mask & PENDING:
            self._retrying.pop(job_id, None)
        if old_mask == new_mask:
            return
        if key is None:
            if job is None:
                return
            key = (job.submitted_seq, next(self._ordinals))
        self._jobs[job_id] = (new_mask, key)
        for bit in _CLASSES:
            if old_mask & bit and not new_mask & bit:
                self._ordered[bit].remove(key)
            elif new_mask & bit and not old_mask & bit and job is not None:
                self._ordered[bit].add(key, job)
        self._count_pending(job_id, job if new_mask & PENDING else None)

    def _count_pending(self, job_id: str, pending: JobView | None) -> None:
        """Move ``job_id`` out of its team's pending count, and into it again while it is ``pending``."""
        team = self._pending_team.pop(job_id, None)
        if team is not None:
            self._pending_by_team[team] -= 1
            if not self._pending_by_team[team]:
                del self._pending_by_team[team]
        if pending is not None:
            self._pending_team[job_id] = pending.spec.team
            self._pending_by_team[pending.spec.team] += 1

    def _file_gates(self, job: JobView, *, pending: bool) -> None:
        """Keep the gated jobs, their dependents and the live jobs by name in step with ``job``."""
        spec = job.spec
        named = self._live_named.setdefault((spec.team, spec.name), {})
        if job.terminal:
            named.pop(job.job_id, None)
            if not named:
                del self._live_named[(spec.team, spec.name)]
        else:
            named[job.job_id] = job.submitted_seq
        throttled = spec.array is not None and spec.array.max_running is not None
        if throttled and spec.array is not None:
            live = self._array_live.setdefault(spec.array.array_id, {})
            if job.terminal:
                live.pop(job.job_id, None)
            else:
                live[job.job_id] = job
        if not (spec.depends_on or spec.singleton or throttled):
            return
        waiting = pending and not job.terminal
        if waiting:
            self._gated[job.job_id] = job
        else:
            self._gated.pop(job.job_id, None)
        for dep in spec.depends_on:
            ids = self._dependents.setdefault(dep.job_id, set())
            if waiting:
                ids.add(job.job_id)
            else:
                ids.discard(job.job_id)
                if not ids:
                    del self._dependents[dep.job_id]

    def gated(self) -> Mapping[str, JobView]:
        """Pending jobs with dependencies or a singleton flag, by id. Do not mutate."""
        return self._gated

    def array_live(self, array_id: str) -> Mapping[str, JobView]:
        """The live (not ended) members of a throttled array, by id. Do not mutate."""
        return self._array_live.get(array_id, {})

    def dependents(self, job_id: str) -> frozenset[str]:
        """The pending jobs that wait on ``job_id``."""
        return frozenset(self._dependents.get(job_id, ()))

    def same_name_earlier(self, job: JobView) -> list[str]:
        """Live jobs of ``job``'s team and name submitted before it, in arrival order."""
        named = self._live_named.get((job.spec.team, job.spec.name), {})
        earlier = [(seq, other) for other, seq in named.items() if seq < job.submitted_seq]
        return [other for _seq, other in sorted(earlier)]

    def pending_count(self, team: str) -> int:
        """How many of ``team``'s jobs are in the PENDING class."""
        return self._pending_by_team[team]

    def jobs_of(self, bit: int) -> list[JobView]:
        """The jobs of class ``bit`` in arrival order (``submitted_seq``). Do not mutate: copy it."""
        return self._ordered[bit].views

    def latest_retry(self) -> float | None:
        """The latest ``retry_at`` of a pending job (None: none waits out a backoff)."""
        return max(self._retrying.values(), default=None)

    # -- nodes --------------------------------------------------------------------------------------

    def refresh_node(self, node_id: str, node: NodeView | None) -> None:
        """Replace ``node_id``'s part of the totals with its current one."""
        share = node_share(node) if node is not None else None
        old = self._shares.get(node_id)
        if share == old:
            return  # most events (a start, an exit) change no node
        if old is not None:
            self._add(old, -1)
            del self._shares[node_id]
        if share is not None:
            self._shares[node_id] = share
            self._add(share, 1)

    def _add(self, share: tuple[int, int, int], sign: int) -> None:
        count, schedulable, free = share
        self.total += sign * count
        self.schedulable += sign * schedulable
        self.free += sign * free
        self._sizes[count] += sign
        if not self._sizes[count]:
            del self._sizes[count]

    def largest_node(self) -> int | None:
        """GPUs of the largest node, or None when no node is known. Few distinct sizes: cheap."""
        return max(self._sizes, default=None)
