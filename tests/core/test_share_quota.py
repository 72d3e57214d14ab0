"""GPU quota and fair share count a share or a MIG slice for its part of a GPU (``core.units``).

Before, every fractional or MIG job counted as one whole GPU against its queue's quota and in DRF: four
0.25-GPU notebooks used four GPUs of quota. Each case here checks what a queue admits, what a waiting
job's reason says (in GPUs, ``0.25``), what ``rally why`` reports, and how DRF orders teams.
"""

from __future__ import annotations

import msgspec

from rallypoint.core import ClusterModel, Decisions, Node, PendingJob, Queue, Quota, Snapshot, policy_by_name
from rallypoint.core import schedule as run_schedule
from rallypoint.core.explain import explain
from rallypoint.core.units import GPU_MILLI, mig_milli

from .builders import cluster, nodes, pending, running

RALLYPOINT = policy_by_name("rallypoint")
GIB = 1024


def _schedule(model: ClusterModel, jobs: list[PendingJob], queues: tuple[Queue, ...] = ()) -> Decisions:
    """One rallypoint cycle; the same decisions with the pending list reversed (determinism)."""
    snap = Snapshot(now=1.0, cluster=model, pending=tuple(jobs), queues=queues)
    decisions = run_schedule(snap, RALLYPOINT)
    again = run_schedule(msgspec.structs.replace(snap, pending=tuple(reversed(jobs))), RALLYPOINT)
    assert msgspec.json.encode(decisions) == msgspec.json.encode(again)
    return decisions


def _reasons(decisions: Decisions) -> dict[str, tuple[str, str]]:
    return {p.job_id: (p.code, p.message) for p in decisions.pending}


def _one_queue(nominal: int) -> tuple[Queue, ...]:
    """Queue ``t`` (the builders' team) with ``nominal`` GPUs and no cohort: nothing to borrow."""
    return (Queue(name="t", quotas=(Quota(nominal=nominal),)),)


def test_four_quarter_gpu_notebooks_use_one_gpu_of_quota() -> None:
    model = cluster(nodes(per_rack=1))
    jobs = [pending(f"nb{i}", 1, submit=float(i), gpu_milli=250) for i in range(5)]
    d = _schedule(model, jobs, _one_queue(1))
    assert sorted(b.job_id for b in d.binds) == ["nb0", "nb1", "nb2", "nb3"]
    code, message = _reasons(d)["nb4"]
    assert code == "QuotaExceeded", message
    assert "queue t uses 1 of 1 nominal h100 GPUs; needs 0.25; cohort can lend 0" in message, message
    for b in d.binds:
        model.bind(running(b.job_id, {b.placements[0].node_id: b.placements[0].gpus}, gpu_milli=250))
    assert model.usage[("t", "h100")] == GPU_MILLI
    assert model.team_usage["t"][0] == GPU_MILLI


def test_a_share_holds_its_part_of_the_quota_against_whole_gpu_jobs() -> None:
    model = cluster(nodes(per_rack=1), [running("nb", {"s0r0n0": (0,)}, gpu_milli=500)])
    d = _schedule(model, [pending("two", 2, gpt=2), pending("one", 1, submit=1.0)], _one_queue(2))
    # 0.5 + 1 fits 2, so "one" is within nominal (tier 0) and goes first; 0.5 + 2 does not
    assert [b.job_id for b in d.binds] == ["one"]
    code, message = _reasons(d)["two"]
    assert code == "QuotaExceeded" and "queue t uses 1.5 of 2 nominal h100 GPUs; needs 2" in message, message


def test_mig_slices_count_their_compute_slices_of_seven() -> None:
    assert [mig_milli(p) for p in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")] == [
        142, 142, 285, 428, 571, 1000,
    ]  # fmt: skip
    model = cluster(
        [
            Node(
                id="h",
                rack="r",
                gpu_type="H100",
                gpus=8,
                mig_gpus=(0, 1),
                cpu_milli=64_000,
                memory_mib=1 << 20,
            )
        ]
    )
    queues = (Queue(name="t", quotas=(Quota(gpu_type="H100", nominal=1),)),)
    jobs = [pending(f"e{i}", 1, submit=float(i), mig_profile="1g.10gb") for i in range(8)]
    d = _schedule(model, jobs, queues)
    assert len(d.binds) == 7  # 7 x 142 = 994 thousandths: within one GPU of quota; an eighth is not
    code, message = _reasons(d)["e7"]
    assert code == "QuotaExceeded" and "uses 0.994 of 1 nominal H100 GPUs; needs 0.142" in message, message


def test_a_gpu_memory_share_is_checked_again_at_the_share_it_gets() -> None:
    # one type on two GPU sizes: 20 GiB is a quarter of an 80 GiB GPU but half of the 40 GiB one, where
    # the share lands (the node with the fewest free GPUs comes first, keeping whole nodes whole)
    small = Node(id="n40", rack="r", gpu_type="h", gpus=1, gpu_memory_mib=40 * GIB, cpu_milli=1, memory_mib=1)
    big = Node(id="n80", rack="r", gpu_type="h", gpus=8, gpu_memory_mib=80 * GIB, cpu_milli=1, memory_mib=1)
    model = cluster(
        [small, big],
        [
            running("whole", {"n80": (2,)}),
            running("mine", {"n80": (0,)}, gpu_milli=700),
            running("theirs", {"n80": (0,)}, team="u", gpu_milli=250),
        ],
    )
    queues = (Queue(name="t", quotas=(Quota(gpu_type="h", nominal=2),)),)
    ask = pending("mem", 1, gpu_milli=0, gpu_memory_mib=20 * GIB)
    d = _schedule(model, [ask], queues)
    # 1.7 used + 0.25 (its least share) passes the first check; it places at 0.5, which 2 cannot take
    assert not d.binds
    code, message = _reasons(d)["mem"]
    assert code == "QuotaExceeded" and "queue t uses 1.7 of 2 nominal h GPUs; needs 0.5" in message, message
    d = _schedule(model, [ask], (Queue(name="t", quotas=(Quota(gpu_type="h", nominal=3),)),))
    assert [(b.job_id, b.placements[0].node_id, b.placements[0].milli) for b in d.binds] == [
        ("mem", "n40", 500)
    ]


def test_drf_counts_a_share_for_its_part_of_a_gpu() -> None:
    # x holds four quarter GPUs (one GPU's worth), y two whole GPUs; one GPU is free. Counted as whole
    # GPUs x held four and y went first; counted by share x holds less and goes first, though it came later
    model = cluster(
        nodes(per_rack=1),
        [
            *(running(f"x{g}", {"s0r0n0": (g,)}, team="x", gpu_milli=250) for g in range(4)),
            running("y0", {"s0r0n0": (4, 5)}, team="y"),
            running("z0", {"s0r0n0": (7,)}, team="z"),
        ],
    )
    assert model.team_usage["x"][0] == GPU_MILLI and model.team_usage["y"][0] == 2 * GPU_MILLI
    d = _schedule(model, [pending("ylate", 1, team="y"), pending("xnext", 1, submit=1.0, team="x")])
    assert [b.job_id for b in d.binds] == ["xnext"]


def test_rally_why_reports_the_quota_in_gpus_with_the_share_asked() -> None:
    model = cluster(nodes(per_rack=1), [running(f"nb{i}", {"s0r0n0": (i,)}, gpu_milli=250) for i in range(3)])
    snap = Snapshot(now=1.0, cluster=model, pending=(), queues=_one_queue(1))
    why = explain(snap, pending("half", 1, gpu_milli=500), RALLYPOINT.config)
    (room,) = why.quotas
    assert (room.asked, room.used, room.nominal, room.room, room.short) == (0.5, 0.75, 1.0, 0.25, 0.25)
    assert any(
        "room for 0.25 more h100 GPUs in queue t's quota (it uses 0.75 of nominal 1" in s
        for s in why.would_start
    ), why.would_start
