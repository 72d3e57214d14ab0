"""Gang placement: the lowest topology level that holds the whole gang, best fit, NVLink-aware.

A gang is ``tasks`` tasks of ``gpt`` GPUs; every task lands on one node and, when ``gpt`` fits an NVLink
domain, inside one domain. Levels are tried bottom up (node, rack, spine, cluster) up to the required
level; at each level the domain with the *smallest* sufficient capacity wins (best fit keeps large blocks
free), ties broken by topology order. Capacities come from per-rack/spine histograms of free counts, so
choosing a rack costs O(racks x GPUs per node), not O(nodes); the chosen domain is then verified exactly.

Everything returns plans; :func:`apply` takes the GPUs in the workspace (journaled, so it can be rolled
back).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from rallypoint.core.workspace import Workspace

__all__ = [
    "LEVELS",
    "Plan",
    "apply",
    "best_free_at",
    "bits",
    "level_rank",
    "lowest_bits",
    "new_plan",
    "place",
    "plan_of",
]

LEVELS = ("nvlink", "node", "rack", "spine", "cluster")
_RANK = {lv: i for i, lv in enumerate(LEVELS)}


def level_rank(level: str | None) -> int:
    return _RANK["cluster"] if level is None else _RANK[level]


class Plan(NamedTuple):
    gpu_type: str
    level: str
    tasks: tuple[tuple[int, int], ...]  # (node ordinal, GPU mask) per task, in task order


# ``new_plan(t, level, tasks)`` is ``Plan(t, level, tasks)`` without the Python-level ``__new__`` that
# ``NamedTuple`` generates (~0.3 us less per plan; a cycle makes thousands of them)
def new_plan(gpu_type: str, level: str, tasks: tuple[tuple[int, int], ...]) -> Plan:
    return _tuple_new(Plan, (gpu_type, level, tasks))


_tuple_new = tuple.__new__
# ``plan_of((t, level, tasks))``: ``new_plan`` from one tuple, with no Python frame at all (the one-task
# fast path of ``Ctx.place`` makes a plan for most binds)
plan_of: Callable[[tuple[str, str, tuple[tuple[int, int], ...]]], Plan] = partial(_tuple_new, Plan)


BITS: dict[int, tuple[int, ...]] = {}  # mask -> its set bit indices (the memo behind ``bits``)


def bits(mask: int) -> tuple[int, ...]:
    """The GPU indices set in ``mask``, ascending (memoized: masks are node-sized, few distinct)."""
    t = BITS.get(mask)
    if t is None:
        t = BITS[mask] = tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
    return t


_LOWEST: dict[int, dict[int, int]] = {}  # k -> mask -> lowest k bits (masks are node-sized: few distinct)


def lowest_bits(mask: int, k: int) -> int:
    tab = _LOWEST.get(k)
    if tab is None:
        tab = _LOWEST[k] = {}
    hit = tab.get(mask)
    if hit is not None:
        return hit
    out = 0
    m = mask
    for _ in range(k):
        low = m & -m
        out |= low
        m ^= low
    if mask.bit_length() <= 64:
        tab[mask] = out
    return out


def node_cap(ws: Workspace, o: int, g: int) -> int:
    """How many tasks of ``g`` GPUs node ``o`` can take now (each inside one NVLink domain if it fits)."""
    f = ws.free[o]
    idx = ws.idx
    if not idx.multi_dom[o] or g > idx.dom_size[o]:
        return f.bit_count() // g
    return sum((f & d).bit_count() // g for d in idx.doms[o])


def _pick(ws: Workspace, o: int, free: int, g: int) -> int:
    """GPUs for one task on node ``o`` from ``free``: the tightest NVLink domain that holds it."""
    idx = ws.idx
    if idx.multi_dom[o] and g <= idx.dom_size[o]:
        best = -1
        best_c = 1 << 30
        for d in idx.doms[o]:
            c = (free & d).bit_count()
            if g <= c < best_c:
                best, best_c = d, c
        return lowest_bits(free & best, g)
    return lowest_bits(free, g)


def _fill_node(ws: Workspace, o: int, g: int, n: int, out: list[tuple[int, int]]) -> None:
    free = ws.free[o]
    for _ in range(n):
        m = _pick(ws, o, free, g)
        out.append((o, m))
        free &= ~m


def _hist_cap(hist: list[int], g: int) -> int:
    return sum(hist[c] * (c // g) for c in range(g, len(hist)) if hist[c])


def _hist_free(hist: list[int]) -> int:
    return sum(c * hist[c] for c in range(1, len(hist)) if hist[c])


def _single_node(ws: Workspace, t: str, g: int, n: int, first_fit: bool) -> int | None:
    """Node (ordinal) of type ``t`` that takes ``n`` tasks of ``g``: best fit (fewest free) or first fit."""
    bs = ws.buckets[t]
    best: int | None = None
    multi = ws.idx.multi_dom
    for c in range(g * n, len(bs)):
        b = bs[c]
        if not b:
            continue
        if not first_fit and not multi[b[0]]:
            return b[0]  # best fit: a single-domain node with c >= g * n free GPUs takes the gang
        for o in b:
            if best is not None and o >= best:
                break
            if node_cap(ws, o, g) >= n:
                if not first_fit:
                    return o
                best = o
                break
    return best


def _nvlink_node(ws: Workspace, t: str, g: int, first_fit: bool) -> int | None:
    """Node (ordinal) of type ``t`` with ``g`` free GPUs inside one NVLink domain: best fit (fewest free
    GPUs on the node) or first fit (lowest ordinal)."""
    bs = ws.buckets[t]
    idx = ws.idx
    multi, dom_size = idx.multi_dom, idx.dom_size
    best: int | None = None
    for c in range(g, len(bs)):
        for o in bs[c]:
            if best is not None and o >= best:
                break
            if not multi[o] or (g <= dom_size[o] and node_cap(ws, o, g) >= 1):
                if not first_fit:
                    return o
                best = o
                break
    return best


def _rack_nodes_plan(ws: Workspace, r: int, t: str, g: int, need: int, out: list[tuple[int, int]]) -> int:
    """Fill up to ``need`` tasks from rack ``r``, fullest nodes first (best fit). Returns tasks placed.

    Candidates in (free count, ordinal) order come straight from the per-count buckets (sorted ordinals
    of schedulable ``t`` nodes): a rack is a contiguous ordinal range, so each bucket's slice for the rack
    is two bisections, and nodes with fewer than ``g`` free GPUs are never looked at."""
    idx = ws.idx
    free, multi = ws.free, idx.multi_dom
    lo, hi = idx.rack_lo[r], idx.rack_hi[r]
    bs = ws.buckets[t]
    placed = 0
    for c in range(g, len(bs)):
        b = bs[c]
        if not b:
            continue
        i = bisect_left(b, lo)
        j = bisect_left(b, hi, i)
        if i == j:
            continue
        for o in b[i:j]:
            if multi[o]:
                cap = node_cap(ws, o, g)
                if not cap:
                    continue
                k = min(cap, need - placed)
                _fill_node(ws, o, g, k, out)
            elif c == g:  # exactly one task, all the node's free GPUs (a whole free node for g = 8)
                out.append((o, free[o]))
                k = 1
            else:  # _fill_node for a single-domain node: the lowest g free GPUs, k times
                k = min(c // g, need - placed)
                f = free[o]
                for _ in range(k):
                    m = lowest_bits(f, g)
                    out.append((o, m))
                    f &= ~m
            placed += k
            if placed == need:
                return placed
    return placed


def _rack_exact(ws: Workspace, r: int, t: str, g: int, rcaps: list[int]) -> int:
    idx = ws.idx
    if not idx.rack_multi[r]:
        return rcaps[r]  # single-domain nodes only: the incremental count is exact
    free, sched, type_of, multi = ws.free, ws.sched, idx.type_of, idx.multi_dom
    n = 0
    for o in idx.rack_nodes[r]:
        if sched[o] and type_of[o] == t:
            n += node_cap(ws, o, g) if multi[o] else free[o].bit_count() // g
    return n


def _place_type(ws: Workspace, t: str, tasks: int, g: int, max_rank: int, first_fit: bool) -> Plan | None:
    idx = ws.idx
    if ws.type_free[t] < tasks * g or g > idx.max_gpus:
        return None
    if tasks == 1 and not first_fit:
        # fast path of the node level below for one task (most jobs): the first non-empty bucket's first
        # node, when it has a single NVLink domain, is exactly what ``_single_node`` would return
        bs = ws.buckets[t]
        for c in range(g, len(bs)):
            b = bs[c]
            if b:
                o1 = b[0]
                if not idx.multi_dom[o1]:
                    return new_plan(t, "nvlink", ((o1, lowest_bits(ws.free[o1], g)),))
                break
    # node level (or one NVLink domain for a single small task)
    if tasks * g <= idx.max_gpus and max_rank >= _RANK["nvlink"]:
        o = _single_node(ws, t, g, tasks, first_fit)
        if o is not None:
            level = "nvlink" if tasks == 1 and g <= idx.dom_size[o] else "node"
            if _RANK[level] > max_rank and tasks == 1:
                # one NVLink domain required and the best-fit node's domains are smaller than the task:
                # another node's may not be (mixed NVLink layouts)
                o = _nvlink_node(ws, t, g, first_fit)
                level = "nvlink"
            if o is not None and _RANK[level] <= max_rank:
                out: list[tuple[int, int]] = []
                _fill_node(ws, o, g, tasks, out)
                return new_plan(t, level, tuple(out))
    if tasks == 1 or max_rank < _RANK["rack"]:
        return None
    # rack level: smallest sufficient capacity (first fit: first sufficient rack); capacities are kept
    # incrementally per task size by the workspace, so this is one pass over an int list
    rcaps = ws.rack_caps(t, g)
    values = set(rcaps)  # the distinct capacities (a few dozen): cheaper to scan than every rack
    if max(values, default=0) >= tasks:
        if first_fit:
            racks = [(0, r) for r, c in enumerate(rcaps) if c >= tasks]
        else:
            # the smallest sufficient rack, min((c, r) for c >= tasks), without a Python pass over the
            # racks: the smallest sufficient capacity value, then its first rack (list.index)
            cmin = min([c for c in values if c >= tasks])
            first = (cmin, rcaps.index(cmin))
            # it nearly always verifies: build and sort the full list only when it does not
            if _rack_exact(ws, first[1], t, g, rcaps) >= tasks:
                racks = [first]
            else:
                racks = sorted((c, r) for r, c in enumerate(rcaps) if c >= tasks)
        for _cap, r in racks:
            if _rack_exact(ws, r, t, g, rcaps) >= tasks:
                out = []
                _rack_nodes_plan(ws, r, t, g, tasks, out)
                return new_plan(t, "rack", tuple(out))
    if max_rank < _RANK["spine"]:
        return None
    scaps = ws.spine_caps(t, g)
    spines = sorted((0 if first_fit else c, s) for s, c in enumerate(scaps) if c >= tasks)
    for _cap, s in spines:
        plan = _span(ws, t, g, tasks, idx.spine_racks[s], "spine", rcaps)
        if plan is not None:
            return plan
    if max_rank < _RANK["cluster"]:
        return None
    # cluster level: spines with the most capacity first, so the gang spans as few spines as possible
    racks_all: list[int] = []
    for _c, s in sorted((-scaps[s], s) for s in range(len(scaps)) if (t, s) in ws.spine_hist):
        racks_all.extend(idx.spine_racks[s])
    return _span(ws, t, g, tasks, racks_all, "cluster", rcaps)


def _span(
    ws: Workspace, t: str, g: int, tasks: int, racks: list[int], level: str, rcaps: list[int]
) -> Plan | None:
    """Gang across several racks: racks with the most capacity first (fewest racks spanned)."""
    cap = rcaps.__getitem__
    if sum(map(cap, racks)) < tasks:
        return None  # capacities are upper bounds: not enough even before the exact per-node fill
    # racks in (-capacity, index) order: sorted by index, then stably by capacity, largest first (two
    # C-keyed int sorts instead of building and sorting a tuple per rack)
    rs = sorted([r for r in racks if rcaps[r] > 0])
    rs.sort(key=cap, reverse=True)
    out: list[tuple[int, int]] = []
    for r in rs:
        _rack_nodes_plan(ws, r, t, g, tasks - len(out), out)
        if len(out) == tasks:
            return new_plan(t, level, tuple(out))
    return None


def place(
    ws: Workspace,
    tasks: int,
    gpt: int,
    gpu_type: str | None,
    required: str | None = None,
    first_fit: bool = False,
) -> Plan | None:
    """A plan for the whole gang, or None. Does not modify the workspace."""
    max_rank = level_rank(required)
    types = ws.idx.types if gpu_type is None else ([gpu_type] if gpu_type in ws.type_free else [])
    if len(types) == 1:
        return _place_type(ws, types[0], tasks, gpt, max_rank, first_fit)
    best: Plan | None = None
    for t in types:
        p = _place_type(ws, t, tasks, gpt, max_rank, first_fit)
        if p is not None and (best is None or _RANK[p.level] < _RANK[best.level]):
            best = p
    return best


def apply(ws: Workspace, plan: Plan) -> None:
    for o, m in plan.tasks:
        ws.take(o, m)


def best_free_at(ws: Workspace, gpu_type: str | None, level: str, types: list[str] | None = None) -> int:
    """Most free GPUs inside one domain of ``level`` (for pending-reason messages): of ``gpu_type`` (None:
    any type), or of any of ``types`` when given (a job allowing several types)."""
    if types is None:
        types = ws.idx.types if gpu_type is None else [gpu_type]
    best = 0
    if level in ("node", "nvlink"):
        for t in types:
            bs = ws.buckets.get(t)
            if bs:
                for c in range(len(bs) - 1, 0, -1):
                    if bs[c]:
                        best = max(best, c)
                        break
        return best
    hists = ws.rack_hist if level == "rack" else ws.spine_hist if level == "spine" else None
    if hists is None:
        return sum(ws.type_free.get(t, 0) for t in types)
    for (t, _d), h in hists.items():
        if t in types:
            best = max(best, _hist_free(h))
    return best
