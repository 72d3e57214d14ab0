"""The in-memory transaction one scheduling cycle works on.

A :class:`Workspace` copies the mutable arrays of a :class:`ClusterIndex` (free masks, per-count buckets,
rack/spine histograms, queue usage) and journals every change so that a tentative action (a preemption
plan, a reservation probe) can be rolled back to a mark. The ClusterModel itself is never written.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from rallypoint.core.cluster import ClusterIndex, ClusterModel

__all__ = ["Workspace"]


class Workspace:
    def __init__(self, cluster: ClusterModel) -> None:
        idx = cluster.index()
        self.idx: ClusterIndex = idx
        self.cluster = cluster
        self.free: list[int] = list(idx.free)
        self.sched = idx.sched
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
        self.type_free = dict(idx.type_free)
        self.fcount = idx.fcount[:]  # free GPUs per schedulable node (0 when unschedulable), a flat copy
        self.usage: dict[tuple[str, str], int] = dict(cluster.usage)
        # (kind, a, old, epoch or usage version before, free version before)
        self._journal: list[tuple[int, int, int, int, int]] = []
        self._uk: list[tuple[str, str]] = []  # usage keys referenced by journal entries of kind 1
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
        self._rack_key = idx.rack_key
        self._spine_key = idx.spine_key
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
        rh = self.rack_hist[self._rack_key[o]]
        rh[co] -= 1
        rh[cn] += 1
        sh = self.spine_hist[self._spine_key[o]]
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
        per = [c // g for c in range(len(idx.buckets[t]))]
        rc = [0] * len(idx.racks)
        for (tt, r), h in self.rack_hist.items():
            if tt == t:
                rc[r] = sum(n * k for n, k in zip(h, per, strict=True) if n and k)
        sc = [0] * len(idx.spines)
        for (tt, sp), h in self.spine_hist.items():
            if tt == t:
                sc[sp] = sum(n * k for n, k in zip(h, per, strict=True) if n and k)
        self._rcap[(t, g)] = rc
        self._scap[(t, g)] = sc
        self._tracked_caps[t].append((g, rc, sc))

    def take_all(self, tasks: tuple[tuple[int, int], ...]) -> None:
        """``take`` for every (node, mask) of a plan, in order (the bind path: one call per plan)."""
        free = self.free
        journal = self._journal
        for o, m in tasks:
            old = free[o]
            new = old & ~m
            if new != old:
                journal.append((0, o, old, self.release_epoch, self.version))
                self._set(o, old, new)

    def take(self, o: int, mask: int) -> None:
        self.set_free(o, self.free[o] & ~mask)

    def give(self, o: int, mask: int) -> None:
        self.set_free(o, self.free[o] | mask)

    # --- quota usage -----------------------------------------------------------------------------

    def add_usage(self, queue: str, gpu_type: str, gpus: int) -> None:
        key = (queue, gpu_type)
        old = self.usage.get(key, 0)
        self._journal.append((1, len(self._uk), old, self.usage_version, 0))
        self._uk.append(key)
        self.usage[key] = old + gpus
        self._stamp += 1
        self.usage_version = self._stamp

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
            else:
                self.usage[self._uk[a]] = old
                self.usage_version = stamp

    def commit(self) -> None:
        """Forget the journal (nothing to undo below this point)."""
        self._journal.clear()
        self._uk.clear()
