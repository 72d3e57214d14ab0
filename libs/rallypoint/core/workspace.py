"""The in-memory transaction one scheduling cycle works on.

A :class:`Workspace` copies the mutable arrays of a :class:`ClusterIndex` (free masks, per-count buckets,
rack/spine histograms, queue usage) and journals every change so that a tentative action (a preemption
plan, a reservation probe) can be rolled back to a mark; binds (``bind``), which the engine never makes
inside such a transaction, are not journaled. The ClusterModel itself is never written.

The cycle's holds (GPUs set aside for a reserved or preempting job: ``add_hold`` / ``set_hold`` /
``remove_hold``) and its counters and per-cycle maps (``put``: preemptions and consolidations tried,
reservations made, victims chosen, GPUs being evicted per queue) live in the same journal, so a
rollback to a mark undoes everything done since it, not only the free GPUs and quota usage.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, NamedTuple

import numpy as np

from rallypoint.core.cluster import ClusterIndex, ClusterModel

__all__ = ["Hold", "Workspace"]

_MISSING: Any = object()  # ``put``'s journal entry for a key that was absent


class Hold(NamedTuple):
    """GPUs set aside for a reserved or preempting job until ``until`` (the shadow time)."""

    job_id: str
    until: float
    tasks: tuple[tuple[int, int], ...]  # (node ordinal, mask) GPUs that were free when held
    # a preemptor's hold: nobody else may use it, not even a job that would end before ``until``
    # (the victims' GPUs are promised to the preemptor)
    strict: bool = False


class Workspace:
    def __init__(self, cluster: ClusterModel) -> None:
        idx = cluster.index()
        self.idx: ClusterIndex = idx
        self.cluster = cluster
        self.free: list[int] = list(idx.free)
        # a copy: ``open_node`` opens a tainted node to one job inside a transaction
        self.sched = list(idx.sched)
        # bucket 0 (nodes with no free GPU, most of a busy cluster) is not kept: no placement reads it, and
        # keeping it sorted was a memmove of ~9,000 ordinals per bind
        self.buckets: dict[str, list[list[int]]] = {
            t: [[], *(list(b) for b in bs[1:])] for t, bs in idx.buckets.items()
        }
        self._type_of = idx.type_of
        self._rack_of = idx.rack_of
        self._spine_of = idx.spine_of
        self.rack_hist = {k: list(v) for k, v in idx.rack_hist.items()}
        self.spine_hist = {k: list(v) for k, v in idx.spine_hist.items()}
        # the same histogram lists in the index's slot order (``idx.rack_slot[o]`` / ``idx.spine_slot[o]``)
        self._rack_hists = list(self.rack_hist.values())
        self._spine_hists = list(self.spine_hist.values())
        self._rack_slot = idx.rack_slot
        self._spine_slot = idx.spine_slot
        self.type_free = dict(idx.type_free)
        self.fcount = idx.fcount[:]  # free GPUs per schedulable node (0 when unschedulable), a flat copy
        self.usage: dict[tuple[str, str], int] = dict(cluster.usage)
        # (kind, a, old, epoch or usage version before, free version before)
        self._journal: list[tuple[int, int, int, int, int]] = []
        self._uk: list[tuple[str, str]] = []  # usage keys referenced by journal entries of kind 1
        # what journal entries of kinds 2-5 (holds, ``put``) need to undo themselves
        self._objs: list[Any] = []
        # The cycle's holds, in the order they were made; ``hold_ids``: every job id given a hold (a
        # fast miss for "has this job a hold?"); ``hold_changes``: a stamp that changes whenever the holds
        # change (memos of held GPUs), restored by a rollback like the other stamps.
        self.holds: list[Hold] = []
        self.hold_ids: set[str] = set()
        self.hold_changes = 0
        # Stamps for memos. ``release_epoch`` changes whenever GPUs are released (placement failure memos
        # are valid only while free capacity can only shrink), ``version`` on every change of free GPUs
        # (pending-reason memos), ``usage_version`` on every change of queue usage (quota memos). A new
        # stamp is always a never-used number, and a rollback restores the stamps of the state it returns
        # to: probes (reservations, holds, preemption plans) that undo themselves keep memos valid.
        self._stamp = 0
        self.release_epoch = 0
        self.version = 0
        self.usage_version = 0
        # Per (type, task size g): tasks of g GPUs each rack / spine can take by free counts, kept
        # incrementally for the task sizes placement has asked about this cycle, so choosing a rack is a
        # scan of one int list instead of a histogram sum per rack (an upper bound on multi-domain nodes,
        # exactly like the histogram it replaces; the chosen rack is verified exactly).
        # per type: (g, per-rack caps, per-spine caps) of every tracked task size, updated in ``_set``
        self._tracked_caps: dict[str, list[tuple[int, list[int], list[int]]]] = {t: [] for t in idx.types}
        self._rcap: dict[tuple[str, int], list[int]] = {}
        self._scap: dict[tuple[str, int], list[int]] = {}

    # --- free GPUs -------------------------------------------------------------------------------

    def set_free(self, o: int, mask: int) -> None:
        old = self.free[o]
        if old == mask:
            return
        self._journal.append((0, o, old, self.release_epoch, self.version))
        self._set(o, old, mask)

    def _set(self, o: int, old: int, mask: int) -> None:
        self.free[o] = mask
        st = self._stamp = self._stamp + 1
        self.version = st
        if mask & ~old:
            self.release_epoch = st
        if not self.sched[o]:
            return
        co, cn = old.bit_count(), mask.bit_count()
        if co == cn:
            return
        self.fcount[o] = cn
        t = self._type_of[o]
        bt = self.buckets[t]
        if co:
            b = bt[co]
            del b[bisect_left(b, o)]
        if cn:
            insort(bt[cn], o)
        rh = self._rack_hists[self._rack_slot[o]]
        rh[co] -= 1
        rh[cn] += 1
        sh = self._spine_hists[self._spine_slot[o]]
        sh[co] -= 1
        sh[cn] += 1
        self.type_free[t] += cn - co
        tracked = self._tracked_caps[t]
        if tracked:
            r = self._rack_of[o]
            sp = self._spine_of[o]
            for g, rc, sc in tracked:
                d = cn // g - co // g
                if d:
                    rc[r] += d
                    sc[sp] += d

    def rack_caps(self, t: str, g: int) -> list[int]:
        """Per rack index: tasks of ``g`` GPUs its schedulable ``t`` nodes can take by free counts."""
        caps = self._rcap.get((t, g))
        if caps is None:
            self._track(t, g)
            caps = self._rcap[(t, g)]
        return caps

    def spine_caps(self, t: str, g: int) -> list[int]:
        caps = self._scap.get((t, g))
        if caps is None:
            self._track(t, g)
            caps = self._scap[(t, g)]
        return caps

    def _track(self, t: str, g: int) -> None:
        idx = self.idx
        # tasks of g GPUs per node by its free count (fcount: 0 on unschedulable nodes), nodes of other
        # types left out, summed per rack / spine: what the rack / spine histograms give, without a Python
        # pass over every histogram (the sums are small integers: exact in float64)
        per = np.frombuffer(self.fcount, np.uint16) // g
        if len(idx.types) > 1:
            per = per * (idx.type_np == idx.types.index(t))
        rc: list[int] = (
            np.bincount(idx.rack_of_np, weights=per, minlength=len(idx.racks)).astype(np.int64).tolist()
        )
        sc: list[int] = (
            np.bincount(idx.spine_of_np, weights=per, minlength=len(idx.spines)).astype(np.int64).tolist()
        )
        self._rcap[(t, g)] = rc
        self._scap[(t, g)] = sc
        self._tracked_caps[t].append((g, rc, sc))

    def bind(self, tasks: tuple[tuple[int, int], ...], queue: str, gpu_type: str, gpus: int) -> None:
        """A bind: ``take`` every (node, mask) of its plan, in order, and ``add_usage`` for its queue.

        Not journaled: the engine binds only outside transactions (no mark is open across a bind, so
        nothing is ever rolled back past one), and the entries of thousands of binds would only pile up.
        The stamps change exactly as with ``take`` / ``add_usage``."""
        free = self.free
        for o, m in tasks:
            old = free[o]
            new = old & ~m
            if new != old:
                self._set(o, old, new)
        key = (queue, gpu_type)
        usage = self.usage
        usage[key] = usage.get(key, 0) + gpus
        st = self._stamp = self._stamp + 1
        self.usage_version = st

    def take(self, o: int, mask: int) -> None:
        self.set_free(o, self.free[o] & ~mask)

    def give(self, o: int, mask: int) -> None:
        self.set_free(o, self.free[o] | mask)

    def open_node(self, o: int) -> None:
        """Make node ``o`` (closed: a tainted node, ``ClusterIndex.tainted``) schedulable until the
        enclosing transaction is rolled back; journaled. Its free GPUs join the buckets and histograms as a
        release does."""
        if self.sched[o]:
            return
        mask = self.free[o]
        self._journal.append((6, o, mask, self.release_epoch, self.version))
        self.free[o] = 0
        self.sched[o] = True
        self._rack_hists[self._rack_slot[o]][0] += 1  # it enters with no free GPU, then gets its own
        self._spine_hists[self._spine_slot[o]][0] += 1
        self._set(o, 0, mask)

    def _close_node(self, o: int) -> None:
        """Undo ``open_node`` (every later change to the node is already undone)."""
        mask = self.free[o]
        self._set(o, mask, 0)
        self._rack_hists[self._rack_slot[o]][0] -= 1
        self._spine_hists[self._spine_slot[o]][0] -= 1
        self.sched[o] = False
        self.fcount[o] = 0
        self.free[o] = mask

    # --- quota usage -----------------------------------------------------------------------------

    def add_usage(self, queue: str, gpu_type: str, gpus: int) -> None:
        key = (queue, gpu_type)
        usage = self.usage
        absent = key not in usage
        old = 0 if absent else usage[key]
        # (the last field: 1 when the key was absent, so a rollback removes it again)
        self._journal.append((1, len(self._uk), old, self.usage_version, int(absent)))
        self._uk.append(key)
        usage[key] = old + gpus
        self._stamp += 1
        self.usage_version = self._stamp

    # --- holds and per-cycle maps (journaled) ------------------------------------------------------

    def _hold_changed(self, kind: int, undo: Any) -> None:
        self._journal.append((kind, len(self._objs), self.hold_changes, 0, 0))
        self._objs.append(undo)
        st = self._stamp = self._stamp + 1
        self.hold_changes = st

    def add_hold(self, h: Hold) -> None:
        """Append ``h`` to the holds (its GPUs are already taken out of the free ones)."""
        self._hold_changed(2, h.job_id not in self.hold_ids)
        self.holds.append(h)
        self.hold_ids.add(h.job_id)

    def set_hold(self, i: int, h: Hold) -> None:
        """Replace the ``i``-th hold by ``h``."""
        self._hold_changed(3, (i, self.holds[i]))
        self.holds[i] = h

    def remove_hold(self, h: Hold) -> None:
        """Drop hold ``h`` (its job keeps its id in ``hold_ids``)."""
        i = self.holds.index(h)
        self._hold_changed(4, (i, h))
        del self.holds[i]

    def put(self, d: dict[Any, Any], key: Any, value: Any) -> None:
        """``d[key] = value``, journaled (``d``: a per-cycle map or counter the cycle's plug-ins share)."""
        self._journal.append((5, len(self._objs), 0, 0, 0))
        self._objs.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def bump(self, d: dict[Any, int], key: Any, n: int = 1) -> None:
        """``d[key] += n`` (from 0 when absent), journaled."""
        self.put(d, key, d.get(key, 0) + n)

    # --- transactions ----------------------------------------------------------------------------

    def mark(self) -> int:
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        j = self._journal
        while len(j) > mark:
            kind, a, old, stamp, ver = j.pop()
            if kind == 0:
                self._set(a, self.free[a], old)
                self.release_epoch = stamp
                self.version = ver
            elif kind == 6:
                self._close_node(a)
                self.release_epoch = stamp
                self.version = ver
            elif kind == 1:
                if ver:
                    del self.usage[self._uk[a]]
                else:
                    self.usage[self._uk[a]] = old
                self.usage_version = stamp
            else:
                self._undo(kind, self._objs[a], old)

    def _undo(self, kind: int, obj: Any, old: int) -> None:
        """Undo a journal entry of a hold (kinds 2-4; ``old``: the hold stamp before) or of ``put`` (5)."""
        if kind == 5:
            d, key, was = obj
            if was is _MISSING:
                del d[key]
            else:
                d[key] = was
            return
        if kind == 2:
            h = self.holds.pop()
            if obj:  # the hold added its job's id
                self.hold_ids.discard(h.job_id)
        elif kind == 3:
            i, h = obj
            self.holds[i] = h
        else:
            i, h = obj
            self.holds.insert(i, h)
        self.hold_changes = old

    def commit(self) -> None:
        """Forget the journal (nothing to undo below this point)."""
        self._journal.clear()
        self._uk.clear()
        self._objs.clear()
