"""One ClusterModel kept in step with the folded ClusterState, so a live cycle does not rebuild it.

``build_snapshot`` builds a fresh ``ClusterModel`` every cycle: a ``Node`` per node and a bind per running
job, a few hundred ms at 12,500 nodes and ~9,000 running jobs, more than the decision. :class:`ModelSync`
owns one model and applies only the difference since its last sync. The core's decisions do not depend on
the order of binds, so a synced model decides exactly as a fresh one on the same state; the tests check
that byte for byte.

Changes are found by value: each view is reduced to the tuple of the fields ``node_of`` / ``running_of`` /
``pending_of`` read; unchanged fields are the very same objects from one cycle to the next, so comparing
two such tuples is a few pointer checks. The fold mutates a job's view in place (its identity says
nothing), so every active job is compared each sync. A node's view is replaced when it (re-)registers and
only its status changes in place, so a node is compared only when its view or status is new. A state
decoded from a snapshot (all-new objects) is diffed the same way, and costs one full comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count
from operator import and_, attrgetter, eq, is_, not_

import msgspec

from rallypoint.core.cluster import ClusterModel
from rallypoint.core.types import (
    DEFAULT_PRIORITY_CLASSES,
    Node,
    PendingJob,
    PriorityClass,
    Queue,
    RunningJob,
    Snapshot,
)
from rallypoint.state import ACTIVE, ClusterState, JobView, NodeView

from .bridge import node_of, pending_of, running_of

__all__ = ["NODE_FIELDS", "PENDING_FIELDS", "RUNNING_FIELDS", "ModelSync", "SyncCounts"]

# Every field of the view that the bridge's conversion reads (tests/unit/test_model_sync.py fails if
# bridge.py starts reading one more without it being added here).
NODE_FIELDS = ("node_id", "rack", "spine", "gpu_type", "gpus", "cpu_milli", "memory_mib", "status", "health")
RUNNING_FIELDS = (
    "job_id", "spec", "submitted_at", "bound_at", "started_at", "placements", "last_preempted_at",
    "preempt_for", "attained_gpu_s", "last_checkpoint_at", "resize",
)  # fmt: skip
PENDING_FIELDS = (
    "job_id", "spec", "submitted_at", "submitted_seq", "last_preempted_at", "run_s", "attained_gpu_s",
)  # fmt: skip

_node_sig = attrgetter(*NODE_FIELDS)
_running_sig = attrgetter(*RUNNING_FIELDS)
_pending_sig = attrgetter(*PENDING_FIELDS)
_status = attrgetter("status")

Sig = tuple[object, ...]


class SyncCounts(msgspec.Struct, kw_only=True):
    """What the syncs so far did to the model (for tests and logs)."""

    syncs: int = 0
    rebuilds: int = 0
    nodes_added: int = 0
    nodes_changed: int = 0
    binds: int = 0
    unbinds: int = 0
    updates: int = 0


def _same_footprint(old: RunningJob, new: RunningJob) -> bool:
    """Whether ``update_running`` alone is exact: it keeps the GPU masks and the queue / team usage of
    ``old``, so every field those are derived from must be unchanged."""
    return (
        old.placements == new.placements
        and old.gpus == new.gpus
        and old.team == new.team
        and old.queue == new.queue
        and old.gpu_type == new.gpu_type
        and old.cpu_milli == new.cpu_milli
        and old.memory_mib == new.memory_mib
    )


class ModelSync:
    """Owns one ``ClusterModel`` and brings it up to date with whatever ``ClusterState`` it is given.

    Any state may be passed (the same fold cycle after cycle is the cheap case; a different or restored
    one is diffed all the same). The model of a returned snapshot is this object's: it is valid until the
    next sync, which mutates it.
    """

    def __init__(self) -> None:
        self.counts = SyncCounts()
        self._model = ClusterModel()
        # state.nodes at the last sync, in its order: ids, views and their status. The fold replaces a node's
        # view when it (re-)registers and changes only its status (and allocation) in place, so the same
        # views with the same status mean no node changed: checked in C, no Python loop over 12,500 nodes
        self._node_ids: list[str] = []
        self._node_views: list[NodeView] = []
        self._node_status: list[str] = []
        self._node_sigs: dict[str, Sig] = {}
        self._running: dict[str, tuple[Sig, RunningJob]] = {}
        self._pending: dict[str, tuple[Sig, PendingJob]] = {}
        self._dirty = True  # the model does not match the caches (start, or a sync that raised)

    @property
    def model(self) -> ClusterModel:
        return self._model

    def sync(self, state: ClusterState) -> ClusterModel:
        """Apply to the model the nodes and running jobs that changed since the last sync."""
        self.counts.syncs += 1
        try:
            if self._dirty or not self._sync_nodes(state):
                self._rebuild(state)
            self._sync_running(state)
        except BaseException:
            # a diff applied halfway leaves model and caches disagreeing: start over next time
            self._dirty = True
            raise
        self._dirty = False
        return self._model

    def snapshot(
        self,
        state: ClusterState,
        now: float,
        *,
        queues: Sequence[Queue] = (),
        priority_classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
    ) -> Snapshot:
        """The snapshot ``build_snapshot`` would give for ``state``, on the synced model."""
        model = self.sync(state)
        return Snapshot(
            now=now,
            cluster=model,
            pending=self._pending_of(state.ready_jobs(now)),
            queues=tuple(queues),
            priority_classes=tuple(priority_classes),
        )

    # --- nodes -----------------------------------------------------------------------------------

    def _rebuild(self, state: ClusterState) -> None:
        self.counts.rebuilds += 1
        self._model = ClusterModel(node_of(state.nodes[k]) for k in sorted(state.nodes))
        self._node_ids = list(state.nodes)
        self._node_views = list(state.nodes.values())
        self._node_status = list(map(_status, self._node_views))
        self._node_sigs = {nid: _node_sig(v) for nid, v in state.nodes.items()}
        self._running = {}

    def _sync_nodes(self, state: ClusterState) -> bool:
        """Bring the nodes up to date; False when only a rebuild can (a node gone or reshaped)."""
        ids = list(state.nodes)
        views = list(state.nodes.values())
        status = list(map(_status, views))
        before = self._node_sigs
        if ids == self._node_ids:
            # positions whose view was replaced or whose status changed, found without a Python-level loop
            fresh = map(and_, map(is_, views, self._node_views), map(eq, status, self._node_status))
            stale = [(ids[i], views[i]) for i in compress(count(), map(not_, fresh))]
            if not stale:
                return True
        else:
            if len(before.keys() & state.nodes.keys()) != len(before):
                return False  # the fold never forgets a node; a different state might
            known = dict(zip(self._node_ids, self._node_views, strict=True))
            old_status = dict(zip(self._node_ids, self._node_status, strict=True))
            stale = [
                (nid, v)
                for nid, v, st in zip(ids, views, status, strict=True)
                if known.get(nid) is not v or old_status[nid] != st
            ]
        model = self._model
        sigs = dict(before)
        added: list[Node] = []
        drains: list[tuple[str, bool]] = []
        for nid, view in stale:
            sig = sigs[nid] = _node_sig(view)
            old = before.get(nid)
            if old == sig:
                continue  # e.g. an agent restart: a new view with the same inventory
            node = node_of(view)
            if old is None:
                added.append(node)
                continue
            current = model.nodes[nid]
            if node == current:
                continue  # e.g. drained -> lost: unschedulable either way
            if msgspec.structs.replace(current, schedulable=node.schedulable) != node:
                # a new shape would leave bound GPU masks and usage keyed on the old one
                return False
            drains.append((nid, node.schedulable))
        for node in added:
            model.add_node(node)
        for nid, flag in drains:
            model.set_schedulable(nid, flag)
        self.counts.nodes_added += len(added)
        self.counts.nodes_changed += len(drains)
        self._node_ids = ids
        self._node_views = views
        self._node_status = status
        self._node_sigs = sigs
        return True

    # --- jobs ------------------------------------------------------------------------------------

    def _sync_running(self, state: ClusterState) -> None:
        applied = self._running
        jobs = state.jobs
        fresh: list[tuple[JobView, Sig]] = []
        changed: list[tuple[JobView, Sig]] = []
        seen = 0
        for job in jobs.values():
            if job.state not in ACTIVE:
                continue
            sig = _running_sig(job)
            prev = applied.get(job.job_id)
            if prev is None:
                fresh.append((job, sig))
            else:
                seen += 1
                if prev[0] != sig:
                    changed.append((job, sig))
        gone: list[str] = []
        if seen != len(applied):
            for jid in applied:
                view = jobs.get(jid)
                if view is None or view.state not in ACTIVE:
                    gone.append(jid)

        model = self._model
        rebind: list[tuple[Sig, RunningJob]] = []
        updates: list[tuple[Sig, RunningJob]] = []
        for job, sig in changed:
            new = running_of(job)
            old = applied[job.job_id][1]
            if new == old:
                applied[job.job_id] = (sig, old)
            elif _same_footprint(old, new):
                updates.append((sig, new))
            else:
                gone.append(job.job_id)
                rebind.append((sig, new))
        # every unbind before any bind: a gang may now hold GPUs another one released this cycle
        for jid in gone:
            model.unbind(jid)
            del applied[jid]
        for sig, new in updates:
            model.update_running(new)
            applied[new.id] = (sig, new)
        rebind.extend((sig, running_of(job)) for job, sig in fresh)
        for sig, new in rebind:
            model.bind(new)
            applied[new.id] = (sig, new)
        self.counts.unbinds += len(gone)
        self.counts.updates += len(updates)
        self.counts.binds += len(rebind)

    def _pending_of(self, waiting: list[JobView]) -> tuple[PendingJob, ...]:
        cache = self._pending
        kept: dict[str, tuple[Sig, PendingJob]] = {}
        out: list[PendingJob] = []
        for job in waiting:
            sig = _pending_sig(job)
            prev = cache.get(job.job_id)
            entry = prev if prev is not None and prev[0] == sig else (sig, pending_of(job))
            kept[job.job_id] = entry
            out.append(entry[1])
        self._pending = kept
        return tuple(out)
