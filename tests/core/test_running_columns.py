"""The running jobs' columns stay consistent through any history of binds and unbinds.

``RunningColumns.remove`` swap-removes task rows: the last row moves into each hole and its job's row
list is re-pointed through ``t_pos``. A wrong pointer would leave a job's rows naming another job's
slot, or its GPUs on another node, and the preemption planner would read them.
"""

from __future__ import annotations

import random

from rallypoint.core import ClusterModel

from .builders import nodes, running


def _check(model: ClusterModel) -> None:
    cols = model.cols
    assert cols.n == len(model.running) and sorted(cols.ids[: cols.n]) == sorted(model.running)
    keys = {n.id: model._node_key[n.id] for n in model.nodes.values()}
    rows_seen = 0
    for job_id, job in model.running.items():
        rows = cols.rows_of[job_id]
        rows_seen += len(rows)
        assert [int(cols.t_pos[r]) for r in rows] == list(range(len(rows)))
        assert all(int(cols.t_job[r]) == cols.slot[job_id] for r in rows)
        assert [(int(cols.t_node[r]), int(cols.t_gpus[r])) for r in rows] == [
            (keys[p.node_id], len(p.gpus)) for p in job.placements
        ]
    assert rows_seen == cols.nt


def test_random_binds_and_unbinds_keep_every_row_with_its_job() -> None:
    rng = random.Random(7)
    ns = nodes(racks=4, per_rack=30, gpus=8)
    model = ClusterModel(ns)
    free = {n.id for n in ns}
    for step in range(400):
        if model.running and (rng.random() < 0.45 or len(free) < 10):
            gone = model.unbind(rng.choice(sorted(model.running)))
            free |= {p.node_id for p in gone.placements}
        else:
            size = rng.choice([1, 1, 2, 5, 17, 40])
            picked = rng.sample(sorted(free), min(size, len(free)))
            model.bind(running(f"j{step}", {n: tuple(range(8)) for n in picked}))
            free -= set(picked)
        _check(model)


def test_freeing_a_large_gang_beside_another_keeps_the_other_intact() -> None:
    ns = nodes(racks=10, per_rack=50, gpus=8)
    model = ClusterModel(ns)
    half = len(ns) // 2
    model.bind(running("a", {n.id: tuple(range(8)) for n in ns[:half]}))
    model.bind(running("b", {n.id: tuple(range(8)) for n in ns[half:]}))
    model.unbind("a")
    _check(model)
    assert model.cols.nt == len(ns) - half
