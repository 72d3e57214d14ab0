"""One ClusterModel kept in step with the folded ClusterState, so a live cycle does not rebuild it.

``build_snapshot`` builds a fresh ``ClusterModel`` every cycle: a ``Node`` per node and a bind per running
job, a few hundred ms at 12,500 nodes and ~9,000 running jobs, more than the decision. :class:`ModelSync`
owns one model and applies only the difference since its last sync. The core's decisions do not depend on
the order of binds, so a synced model decides exactly as a fresh one on the same state; the tests check
that byte for byte.

Two ways to find the difference:

- **What the fold touched** (the live scheduler): ``sync(state, changed)`` with the job and node ids that
  the events applied since the last sync touched (``ClusterState.apply`` returns them; the follower's
  change feed collects them). Only those views are looked at: a cycle costs what changed, not the size of
  the cluster. It is used only when ``state`` is the very object synced last time; anything else (another
  state, ``changed.everything``, no ``changed``, a sync that raised) falls back to the full comparison.
- **By value** (everything else): each view is reduced to the tuple of the fields ``node_of`` /
  ``running_of`` / ``pending_of`` read; unchanged fields are the very same objects from one cycle to the
  next, so comparing two such tuples is a few pointer checks. The fold mutates a job's view in place (its
  identity says nothing), so every active job is compared. A node's view is replaced when it
  (re-)registers and only its status and health change in place, so a node is compared only when its view,
  status or health is new. A state decoded from a snapshot (all-new objects) costs one full comparison.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Set
from itertools import compress, count
from operator import and_, attrgetter, eq, is_, not_
from typing import Protocol

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

from .bridge import node_of, pending_of, running_of, user_usage_of

__all__ = ["NODE_FIELDS", "PENDING_FIELDS", "RUNNING_FIELDS", "Changed", "ModelSync", "SyncCounts"]

# Every field of the view that the bridge's conversion reads (tests/unit/test_model_sync.py fails if
# bridge.py starts reading one more without it being added here).
NODE_FIELDS = (
    "node_id",
    "rack",
    "spine",
    "gpu_type",
    "gpus",
    "cpu_milli",
    "memory_mib",
    "status",
    "health",
    "labels",
    "taints",
)
RUNNING_FIELDS = (
    "job_id", "spec", "submitted_at", "bound_at", "started_at", "placements", "last_preempted_at",
    "preempt_for", "attained_gpu_s", "last_checkpoint_at", "resize",
)  # fmt: skip
PENDING_FIELDS = (
    "job_id", "spec", "submitted_at", "submitted_seq", "last_preempted_at", "run_s", "attained_gpu_s", "user",
)  # fmt: skip
# The node fields of NODE_FIELDS the fold changes in place (the others come only with a new view).
NODE_MUTABLE = ("status", "health")

_node_sig = attrgetter(*NODE_FIELDS)
_running_sig = attrgetter(*RUNNING_FIELDS)
_pending_sig = attrgetter(*PENDING_FIELDS)

Sig = tuple[object, ...]


class Changed(Protocol):
    """The ids the fold's events touched since the last sync (``runtime.Changes`` is one).
    ``everything``: they say nothing (the state was replaced), compare all."""

    @property
    def jobs(self) -> Set[str]: ...

    @property
    def nodes(self) -> Set[str]: ...

    @property
    def everything(self) -> bool: ...


class SyncCounts(msgspec.Struct, kw_only=True):
    """What the syncs so far did to the model (for tests and logs)."""

    syncs: int = 0
    incremental: int = 0  # syncs that looked only at what the fold touched
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


class _NodeList(msgspec.Struct):
    """``state.nodes`` at a full sync, in its order: ids, views and, per field the fold changes in place,
    its values. The fold replaces a node's view when it (re-)registers and changes only its status and
    health (and allocation) in place, so the same views with the same values mean no node changed:
    checked in C, no Python loop over 12,500 nodes."""

    ids: list[str]
    views: list[NodeView]
    mutable: list[list[object]]  # one list per NODE_MUTABLE field

    @classmethod
    def of(cls, state: ClusterState) -> _NodeList:
        views = list(state.nodes.values())
        return cls(list(state.nodes), views, [list(map(attrgetter(f), views)) for f in NODE_MUTABLE])

    def unchanged(self, before: _NodeList) -> Iterator[bool]:
        """Per position (same ids in the same order): the same view with the same in-place values."""
        same: Iterator[bool] = map(is_, self.views, before.views)
        for now, then in zip(self.mutable, before.mutable, strict=True):
            same = map(and_, same, map(eq, now, then))
        return same

    def values_at(self, i: int) -> tuple[object, ...]:
        return tuple(field[i] for field in self.mutable)


class ModelSync:
    """Owns one ``ClusterModel`` and brings it up to date with whatever ``ClusterState`` it is given.

    Any state may be passed (the same fold cycle after cycle is the cheap case; a different or restored
    one is diffed all the same). The model of a returned snapshot is this object's: it is valid until the
    next sync, which mutates it.
    """

    def __init__(self) -> None:
        self.counts = SyncCounts()
        self._model = ClusterModel()
        self._node_sigs: dict[str, Sig] = {}
        self._node_list: _NodeList | None = None  # None: unknown (start, or after incremental syncs)
        self._running: dict[str, tuple[Sig, RunningJob]] = {}
        self._pending: dict[str, tuple[Sig, PendingJob]] = {}
        self._synced: ClusterState | None = None  # the state the model matches (None: start, or raised)

    @property
    def model(self) -> ClusterModel:
        return self._model

    def sync(self, state: ClusterState, changed: Changed | None = None) -> ClusterModel:
        """Apply to the model the nodes and running jobs that changed since the last sync.

        ``changed``: every job and node id the fold touched in ``state`` since the last sync (more is
        harmless, less is wrong); None to compare everything."""
        self.counts.syncs += 1
        usable = changed is not None and not changed.everything and state is self._synced
        touched = changed if usable else None
        synced, self._synced = self._synced, None  # a sync applied halfway: start over next time
        if touched is not None:
            self.counts.incremental += 1
            kept = self._sync_touched_nodes(state, touched.nodes)
        else:
            kept = synced is not None and self._sync_nodes(state)
        if not kept:
            self._rebuild(state)  # and so every running job is bound again
        if touched is not None and kept:
            self._sync_jobs(self._touched_jobs(state, sorted(touched.jobs)))
        else:
            self._sync_jobs(self._all_jobs(state))
        self._synced = state
        return self._model

    def snapshot(
        self,
        state: ClusterState,
        now: float,
        *,
        queues: Sequence[Queue] = (),
        priority_classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
        changed: Changed | None = None,
    ) -> Snapshot:
        """The snapshot ``build_snapshot`` would give for ``state``, on the synced model."""
        model = self.sync(state, changed)
        pending = self._pending_of(state.ready_jobs(now))
        return Snapshot(
            now=now,
            cluster=model,
            pending=pending,
            queues=tuple(queues),
            priority_classes=tuple(priority_classes),
            user_usage=user_usage_of(state, pending, now),
        )

    # --- nodes -----------------------------------------------------------------------------------

    def _rebuild(self, state: ClusterState) -> None:
        self.counts.rebuilds += 1
        self._model = ClusterModel(node_of(state.nodes[k]) for k in sorted(state.nodes))
        self._node_list = _NodeList.of(state)
        self._node_sigs = {nid: _node_sig(v) for nid, v in state.nodes.items()}
        self._running = {}

    def _sync_nodes(self, state: ClusterState) -> bool:
        """Bring every node up to date; False when only a rebuild can (a node gone or reshaped)."""
        now = _NodeList.of(state)
        before = self._node_list
        if before is not None and now.ids == before.ids:
            # positions whose view was replaced or changed in place, found without a Python-level loop
            stale = [(now.ids[i], now.views[i]) for i in compress(count(), map(not_, now.unchanged(before)))]
        else:
            if len(self._node_sigs.keys() & state.nodes.keys()) != len(self._node_sigs):
                return False  # the fold never forgets a node; a different state might
            known = (
                {nid: (before.views[i], before.values_at(i)) for i, nid in enumerate(before.ids)}
                if before
                else {}
            )
            stale = [
                (nid, view)
                for i, (nid, view) in enumerate(zip(now.ids, now.views, strict=True))
                if (seen := known.get(nid)) is None or seen[0] is not view or seen[1] != now.values_at(i)
            ]
        if not self._apply_nodes(stale):
            return False
        self._node_list = now
        return True

    def _sync_touched_nodes(self, state: ClusterState, node_ids: Set[str]) -> bool:
        """Bring the touched nodes up to date; False when only a rebuild can (a node reshaped)."""
        stale = [(nid, view) for nid in sorted(node_ids) if (view := state.nodes.get(nid)) is not None]
        if not stale:
            return True
        self._node_list = None  # its views and values may be stale now; the next full sync compares all
        return self._apply_nodes(stale)

    def _apply_nodes(self, stale: list[tuple[str, NodeView]]) -> bool:
        """Apply nodes whose view may have changed: new ones added, drains and recoveries patched in
        place; False (nothing applied) for a change only a rebuild can (a node reshaped)."""
        model = self._model
        before = self._node_sigs
        sigs: dict[str, Sig] = {}
        added: list[Node] = []
        drains: list[tuple[str, bool]] = []
        for nid, view in stale:
            sig = sigs[nid] = _node_sig(view)
            old = before.get(nid)
            if old == sig:
                continue  # e.g. an agent restart: a new view with the same inventory; or a bind on it
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
        before.update(sigs)
        self.counts.nodes_added += len(added)
        self.counts.nodes_changed += len(drains)
        return True

    # --- jobs ------------------------------------------------------------------------------------

    def _all_jobs(self, state: ClusterState) -> tuple[list[tuple[JobView, Sig]], list[str]]:
        """The active jobs not applied yet or applied with another signature, and the applied jobs no
        longer active."""
        applied = self._running
        changed: list[tuple[JobView, Sig]] = []
        seen = 0
        for job in state.jobs.values():
            if job.state not in ACTIVE:
                continue
            sig = _running_sig(job)
            prev = applied.get(job.job_id)
            if prev is None:
                changed.append((job, sig))
                continue
            seen += 1
            if prev[0] != sig:
                changed.append((job, sig))
        gone: list[str] = []
        if seen != len(applied):
            for jid in applied:
                view = state.jobs.get(jid)
                if view is None or view.state not in ACTIVE:
                    gone.append(jid)
        return changed, gone

    def _touched_jobs(
        self, state: ClusterState, job_ids: Iterable[str]
    ) -> tuple[list[tuple[JobView, Sig]], list[str]]:
        """The touched jobs that are active, with their signatures, and the applied ones no longer."""
        active: list[tuple[JobView, Sig]] = []
        gone: list[str] = []
        for jid in job_ids:
            job = state.jobs.get(jid)
            if job is not None and job.state in ACTIVE:
                active.append((job, _running_sig(job)))
            elif jid in self._running:
                gone.append(jid)
        return active, gone

    def _sync_jobs(self, found: tuple[list[tuple[JobView, Sig]], list[str]]) -> None:
        """Apply ``found`` (active jobs that may have changed, applied jobs that are gone) to the model."""
        active, gone = found
        applied = self._running
        fresh: list[tuple[JobView, Sig]] = []
        rebind: list[tuple[Sig, RunningJob]] = []
        updates: list[tuple[Sig, RunningJob]] = []
        for job, sig in active:
            prev = applied.get(job.job_id)
            if prev is None:
                fresh.append((job, sig))
                continue
            if prev[0] == sig:
                continue
            new = running_of(job)
            old = prev[1]
            if new == old:
                applied[job.job_id] = (sig, old)
            elif _same_footprint(old, new):
                updates.append((sig, new))
            else:
                gone.append(job.job_id)
                rebind.append((sig, new))
        model = self._model
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
