"""The incremental structures behind the fast paths agree with the plain definitions they replace."""

from __future__ import annotations

import random

import numpy as np

from rallypoint.core import ClusterModel, Node, RunningJob, TaskPlacement
from rallypoint.core.config import PolicyConfig
from rallypoint.core.context import Ctx
from rallypoint.core.placement import _rack_exact, _rack_nodes_plan, lowest_bits, node_cap
from rallypoint.core.preemption import RankPreemptor
from rallypoint.core.types import Snapshot
from rallypoint.core.workspace import Workspace


def _mixed_cluster(seed: int) -> ClusterModel:
    rng = random.Random(seed)
    ns = []
    for s in range(2):
        for r in range(3):
            for k in range(6):
                dom: tuple[tuple[int, ...], ...] = ()
                if (r + k) % 3 == 0:
                    dom = ((0, 1, 2, 3), (4, 5, 6, 7))
                ns.append(
                    Node(
                        id=f"s{s}r{r}n{k}",
                        rack=f"r{r}",
                        spine=f"s{s}",
                        gpu_type="a100" if k == 5 else "h100",
                        nvlink_domains=dom,
                        schedulable=not (r == 1 and k == 2),
                    )
                )
    c = ClusterModel(ns)
    for i, n in enumerate(ns):
        used = tuple(sorted(rng.sample(range(8), rng.choice((0, 0, 1, 3, 4, 6, 8)))))
        if used:
            c.bind(
                RunningJob(
                    id=f"j{i}", team="t", gpus=len(used), start_time=0.0,
                    placements=(TaskPlacement(task=0, node_id=n.id, gpus=used),),
                )
            )  # fmt: skip
    return c


def _reference_rack_plan(ws: Workspace, r: int, t: str, g: int, need: int) -> list[tuple[int, int]]:
    """The former per-node scan of ``_rack_nodes_plan``."""
    idx = ws.idx
    cands = []
    for o in idx.rack_nodes[r]:
        f = ws.free[o]
        if not f or not ws.sched[o] or idx.type_of[o] != t:
            continue
        cap = node_cap(ws, o, g)
        if cap:
            cands.append((f.bit_count(), o, cap))
    cands.sort()
    out: list[tuple[int, int]] = []
    for _c, o, cap in cands:
        f = ws.free[o]
        for _ in range(min(cap, need - len(out))):
            if idx.multi_dom[o] and g <= idx.dom_size[o]:
                d = min(
                    (d for d in idx.doms[o] if (f & d).bit_count() >= g), key=lambda d: (f & d).bit_count()
                )
                m = lowest_bits(f & d, g)
            else:
                m = lowest_bits(f, g)
            out.append((o, m))
            f &= ~m
        if len(out) == need:
            break
    return out


def test_rack_fill_and_exact_capacity_match_a_node_scan() -> None:
    for seed in range(5):
        c = _mixed_cluster(seed)
        ws = Workspace(c)
        idx = ws.idx
        for t in idx.types:
            for g in (1, 2, 4, 8):
                rcaps = ws.rack_caps(t, g)
                for r in range(len(idx.racks)):
                    exact = sum(
                        node_cap(ws, o, g) for o in idx.rack_nodes[r] if ws.sched[o] and idx.type_of[o] == t
                    )
                    assert _rack_exact(ws, r, t, g, rcaps) == exact
                    for need in (1, 3, 50):
                        out: list[tuple[int, int]] = []
                        placed = _rack_nodes_plan(ws, r, t, g, need, out)
                        assert out == _reference_rack_plan(ws, r, t, g, need)
                        assert placed == len(out)


def test_free_counts_follow_binds_health_and_rollback() -> None:
    c = _mixed_cluster(7)
    idx = c.index()
    c.set_schedulable(idx.ids[4], False)
    c.set_schedulable(idx.ids[7], False)
    c.set_schedulable(idx.ids[7], True)
    assert list(idx.fcount) == [f.bit_count() if s else 0 for f, s in zip(idx.free, idx.sched, strict=True)]
    ws = Workspace(c)
    before = list(ws.fcount)
    mark = ws.mark()
    ws.take(0, 0b1111)
    ws.give(3, 0xFF)
    ws.give(4, 0xFF)  # unschedulable: its count stays 0
    assert list(ws.fcount) == [f.bit_count() if s else 0 for f, s in zip(ws.free, ws.sched, strict=True)]
    ws.rollback(mark)
    assert list(ws.fcount) == before


def test_free_per_domain_matches_free_in() -> None:
    c = _mixed_cluster(3)
    snap = Snapshot(now=0.0, cluster=c, pending=())
    ctx = Ctx(snap, PolicyConfig())
    ctx.ws.take(1, 0b11)
    for level, n in (
        ("node", len(ctx.idx.nodes)),
        ("rack", len(ctx.idx.racks)),
        ("spine", len(ctx.idx.spines)),
    ):
        doms = np.arange(n, dtype=np.int64)
        for t in ("h100", "a100", "b200"):
            got = RankPreemptor._free_per_domain(ctx, level, doms, t).tolist()
            assert got == [RankPreemptor._free_in(ctx, level, d, t) for d in range(n)]
    got = RankPreemptor._free_per_domain(ctx, "cluster", np.zeros(2, np.int64), "h100").tolist()
    assert got == [RankPreemptor._free_in(ctx, "cluster", 0, "h100")] * 2
