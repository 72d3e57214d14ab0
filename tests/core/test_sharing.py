"""``core.sharing``: fractional GPUs and CPU / memory per task, under every policy.

Each case schedules one cycle (or a few, binding what the previous one bound) and checks where jobs land
and what a waiting job's reason names. Every cycle also runs with the pending list reversed and must give
the same decisions: the core's determinism holds with sharing on.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from rallypoint.core import (
    ClusterModel,
    Decisions,
    Node,
    PendingJob,
    RunningJob,
    Snapshot,
    policy_by_name,
    schedule,
)
from rallypoint.core.mig import free_mask, mig_model
from rallypoint.events import MigSlice, TaskPlacement

from .builders import cluster, cycle_both_orders, nodes, pending, running

POLICIES = ("fifo", "easy-backfill", "las", "rallypoint")


def _bind_all(model: ClusterModel, jobs: list[PendingJob], decisions: Decisions) -> None:
    by_id = {j.id: j for j in jobs}
    for b in decisions.binds:
        j = by_id[b.job_id]
        model.bind(
            RunningJob(
                id=j.id, team=j.team, gpus=b.gpus, placements=b.placements, start_time=100.0,
                gpu_milli=j.gpu_milli, cpu_milli=j.cpu_milli, memory_mib=j.memory_mib,
            )
        )  # fmt: skip


def _where(decisions: Decisions) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {b.job_id: (b.placements[0].node_id, b.placements[0].gpus) for b in decisions.binds}


def _reasons(decisions: Decisions) -> dict[str, tuple[str, str]]:
    return {p.job_id: (p.code, p.message) for p in decisions.pending}


@pytest.mark.parametrize("policy", POLICIES)
def test_fractions_share_one_gpu_until_it_is_full(policy: str) -> None:
    model = cluster(nodes(per_rack=1))
    jobs = [pending(f"nb{i}", 1, submit=float(i), gpu_milli=300) for i in range(4)]
    d = cycle_both_orders(model, jobs, policy)
    where = _where(d)
    # three shares of 300 fill one GPU to 900; the fourth needs a second GPU
    gpus = sorted(where[j][1] for j in where)
    assert len(where) == 4
    assert gpus.count(gpus[0]) == 3 and len(set(gpus)) == 2, gpus
    _bind_all(model, jobs, d)
    assert sorted(model.shares.values()) == [300, 900]
    assert len(model.free_gpus("s0r0n0")) == 6  # two shared GPUs are not free for whole-GPU jobs


@pytest.mark.parametrize("policy", POLICIES)
def test_a_share_goes_to_the_fullest_shared_gpu_that_holds_it(policy: str) -> None:
    model = cluster(nodes(per_rack=1))
    model.bind(running("a", {"s0r0n0": (0,)}, gpu_milli=500))
    model.bind(running("b", {"s0r0n0": (1,)}, gpu_milli=800))
    d = cycle_both_orders(
        model, [pending("small", 1, gpu_milli=200), pending("big", 1, submit=1.0, gpu_milli=600)], policy
    )
    where = _where(d)
    assert where["small"] == ("s0r0n0", (1,))  # 800 + 200: the GPU with the least room that holds it
    assert where["big"][1] not in ((0,), (1,))  # 500 + 600 > 1000: a fresh GPU


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpu_jobs_never_land_on_a_shared_gpu(policy: str) -> None:
    model = cluster(nodes(per_rack=1))
    model.bind(running("nb", {"s0r0n0": (3,)}, gpu_milli=100))
    d = cycle_both_orders(model, [pending("whole", 7, gpt=7), pending("eight", 8, submit=1.0)], policy)
    assert 3 not in _where(d)["whole"][1]
    assert "eight" not in _where(d)
    code, message = _reasons(d)["eight"]
    assert code in ("Resources", "Reservation"), message


@pytest.mark.parametrize("policy", POLICIES)
def test_a_released_share_frees_the_gpu_only_when_it_was_the_last(policy: str) -> None:
    model = cluster(nodes(per_rack=1, gpus=1))
    model.bind(running("a", {"s0r0n0": (0,)}, gpu_milli=500))
    model.bind(running("b", {"s0r0n0": (0,)}, gpu_milli=500))
    with pytest.raises(ValueError, match="milli left"):
        model.bind(running("c", {"s0r0n0": (0,)}, gpu_milli=1))
    model.unbind("a")
    assert model.free_gpus("s0r0n0") == ()
    assert "whole" not in _where(cycle_both_orders(model, [pending("whole", 1)], policy))
    model.unbind("b")
    assert model.free_gpus("s0r0n0") == (0,)
    assert _where(cycle_both_orders(model, [pending("whole", 1)], policy))["whole"] == ("s0r0n0", (0,))


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_per_task_keeps_tasks_off_nodes_without_it(policy: str) -> None:
    ns = [
        Node(id="small", rack="r", gpu_type="h100", gpus=8, cpu_milli=8_000, memory_mib=1 << 20),
        Node(id="large", rack="r", gpu_type="h100", gpus=8, cpu_milli=96_000, memory_mib=1 << 20),
    ]
    model = cluster(ns)
    # best fit by GPUs alone ties the two nodes and picks "large" or "small" by order; 16 cores per task
    # fit only "large", and two tasks of 4 GPUs with 48 cores each fill it
    d = cycle_both_orders(model, [pending("cpu", 8, gpt=4, cpu_milli=48_000)], policy)
    assert {p.node_id for p in d.binds[0].placements} == {"large"}
    _bind_all(model, [pending("cpu", 8, gpt=4, cpu_milli=48_000)], d)
    assert model.node_cpu_mem_used["large"] == (96_000, 0)
    d = cycle_both_orders(model, [pending("more", 1, cpu_milli=9_000)], policy)
    code, message = _reasons(d)["more"]
    assert code == "Resources" and "9000 millicores" in message and "at most 8000 left" in message


@pytest.mark.parametrize("policy", POLICIES)
def test_memory_limits_how_many_tasks_share_a_node(policy: str) -> None:
    ns = [
        Node(id=f"n{i}", rack="r", gpu_type="h100", gpus=8, cpu_milli=64_000, memory_mib=100_000)
        for i in range(3)
    ]
    model = cluster(ns)
    job = pending("mem", 10, gpt=1, memory_mib=25_000)  # four tasks per node at most, by memory
    d = cycle_both_orders(model, [job], policy)
    per_node: dict[str, int] = {}
    for p in d.binds[0].placements:
        per_node[p.node_id] = per_node.get(p.node_id, 0) + 1
    assert sorted(per_node.values()) == [2, 4, 4]
    # without the memory request the same gang packs onto two nodes
    d = cycle_both_orders(cluster(ns), [pending("mem", 10, gpt=1)], policy)
    assert len({p.node_id for p in d.binds[0].placements}) == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_a_fraction_with_cpu_skips_a_shared_gpu_whose_node_lacks_cpu(policy: str) -> None:
    ns = [
        Node(id="a", rack="r", gpu_type="h100", gpus=8, cpu_milli=4_000, memory_mib=1 << 20),
        Node(id="b", rack="r", gpu_type="h100", gpus=8, cpu_milli=64_000, memory_mib=1 << 20),
    ]
    model = cluster(ns)
    model.bind(running("nb", {"a": (0,)}, gpu_milli=500, cpu_milli=4_000))
    d = cycle_both_orders(model, [pending("nb2", 1, gpu_milli=500, cpu_milli=1_000)], policy)
    assert _where(d)["nb2"][0] == "b"


def test_team_usage_counts_cpu_and_memory_of_every_task() -> None:
    model = cluster(nodes(per_rack=2))
    model.bind(running("g", {"s0r0n0": (0, 1), "s0r0n1": (0, 1)}, cpu_milli=3_000, memory_mib=10))
    assert model.team_usage["t"] == (4_000, 6_000, 20)  # GPUs in thousandths (``core.units``)
    model.unbind("g")
    assert model.team_usage["t"] == (0, 0, 0)
    assert model.node_cpu_mem_used == {}


def _mig_nodes() -> list[Node]:
    """One H100 node: GPUs 0 and 1 in MIG mode, 2-7 whole."""
    return [
        Node(id="h", rack="r", gpu_type="H100", gpus=8, mig_gpus=(0, 1), cpu_milli=64_000, memory_mib=1 << 20)
    ]


def _mig_job(job_id: str, profile: str, submit: float = 0.0) -> PendingJob:
    return pending(job_id, 1, submit=submit, mig_profile=profile)


def _bind_mig_all(model: ClusterModel, jobs: list[PendingJob], decisions: Decisions) -> None:
    by_id = {j.id: j for j in jobs}
    for b in decisions.binds:
        j = by_id[b.job_id]
        model.bind(
            RunningJob(
                id=j.id,
                team=j.team,
                gpus=b.gpus,
                placements=b.placements,
                start_time=100.0,
                mig_profile=j.mig_profile,
            )
        )


@pytest.mark.parametrize("policy", POLICIES)
def test_mig_slices_pack_one_mig_gpu_and_whole_jobs_never_touch_it(policy: str) -> None:
    model = cluster(_mig_nodes())
    jobs = [
        _mig_job("a", "3g.40gb"),
        _mig_job("b", "3g.40gb", 1.0),
        _mig_job("c", "1g.10gb", 2.0),
        pending("w", 6, submit=3.0),
    ]
    d = cycle_both_orders(model, jobs, policy)
    cut = {b.job_id: (b.placements[0].gpus[0], b.placements[0].mig) for b in d.binds}
    assert cut["a"][0] == cut["b"][0]  # the two 3g slices fill one GPU before the other is opened
    assert {cut["a"][1].start, cut["b"][1].start} == {0, 4}  # type: ignore[union-attr]
    assert cut["c"][0] != cut["a"][0] and cut["c"][1].start == 6  # type: ignore[union-attr]  # most room left
    assert cut["w"] == (2, None) and set(
        next(b for b in d.binds if b.job_id == "w").placements[0].gpus
    ) == set(range(2, 8))
    _bind_mig_all(model, jobs, d)
    more = [_mig_job("d", "4g.40gb", 4.0), _mig_job("e", "3g.40gb", 5.0)]
    d = cycle_both_orders(model, more, policy)
    assert [(b.job_id, b.placements[0].gpus[0], b.placements[0].mig.start) for b in d.binds] == [  # type: ignore[union-attr]
        ("d", cut["c"][0], 0)
    ]
    code, message = _reasons(d)["e"]
    assert code == "Resources" and "no MIG GPU has a free layout for it now" in message, message
    d = cycle_both_orders(model, [_mig_job("f", "1g.18gb")], policy)  # an H200 profile: H100s do not offer it
    assert "no GPU model of its types offers that profile" in _reasons(d)["f"][1]


@pytest.mark.parametrize("seed", range(20))
def test_a_mig_request_waits_only_when_no_layout_of_the_free_slices_holds_it(seed: int) -> None:
    """Random requests and releases: each request binds exactly when some MIG GPU has a start of its
    profile whose slices no running slice takes (the oracle enumerates the table, as test_mig's does)."""
    rng = random.Random(seed)
    model = cluster(_mig_nodes())
    h100 = mig_model("H100")
    assert h100 is not None
    running_ids: list[str] = []
    for step in range(60):
        if running_ids and rng.random() < 0.35:
            model.unbind(running_ids.pop(rng.randrange(len(running_ids))))
            continue
        profile = rng.choice(h100.profiles)
        fits = any(
            not profile.mask_at(start) & ~free_mask(h100, model.mig_busy.get(("h", g), ()))
            for g in (0, 1)
            for start in profile.starts
        )
        job = _mig_job(f"j{step}", profile.name, float(step))
        d = schedule(Snapshot(now=100.0, cluster=model, pending=(job,)), policy_by_name("rallypoint"))
        assert bool(d.binds) == fits, (step, profile.name, model.mig_busy)
        if d.binds:
            _bind_mig_all(model, [job], d)
            running_ids.append(job.id)


def test_a_mig_bind_checks_its_slice() -> None:
    model = cluster(_mig_nodes())

    def at(job_id: str, gpu: int, profile: str, start: int) -> RunningJob:
        placement = TaskPlacement(
            task=0, node_id="h", gpus=(gpu,), mig=MigSlice(profile=profile, start=start)
        )
        return RunningJob(
            id=job_id, team="t", gpus=1, placements=(placement,), start_time=0.0, mig_profile=profile
        )

    model.bind(at("a", 0, "3g.40gb", 4))
    with pytest.raises(ValueError, match="overlaps"):
        model.bind(at("b", 0, "1g.10gb", 5))
    with pytest.raises(ValueError, match=r"no 3g\.40gb slice at 2"):
        model.bind(at("c", 0, "3g.40gb", 2))
    with pytest.raises(ValueError, match="MIG mode"):
        model.bind(running("f", {"h": (1,)}, gpu_milli=100))
    with pytest.raises(ValueError, match="no whole GPU 1"):
        model.bind(running("w", {"h": (1,)}))
    model.unbind("a")
    model.bind(at("b", 0, "1g.10gb", 5))
    assert model.free_gpus("h") == (2, 3, 4, 5, 6, 7)


def _with_class(job: RunningJob, priority_class: str, preempting_for: str | None = None) -> RunningJob:
    return msgspec.structs.replace(job, priority_class=priority_class, preempting_for=preempting_for)


def _rallypoint(model: ClusterModel, jobs: list[PendingJob]) -> Decisions:
    return cycle_both_orders(model, jobs, "rallypoint")


def test_a_notebook_preempts_the_fewest_lower_shares_it_needs_and_never_a_production_one() -> None:
    model = cluster([Node(id="h", rack="r", gpu_type="H100", gpus=1, cpu_milli=64_000, memory_mib=1 << 20)])
    model.bind(_with_class(running("be3", {"h": (0,)}, gpu_milli=300), "best-effort"))
    model.bind(_with_class(running("be4", {"h": (0,)}, gpu_milli=400), "best-effort"))
    model.bind(_with_class(running("prod", {"h": (0,)}, gpu_milli=300), "production"))
    nb = pending("nb", 1, gpu_milli=500, priority_class="training-high")
    d = _rallypoint(model, [nb])
    assert sorted((p.victim_id, p.for_job) for p in d.preemptions) == [("be3", "nb"), ("be4", "nb")]
    assert _reasons(d)["nb"][0] == "Preempting"
    # while they stop it waits, naming them, and asks for no one else
    for v in ("be3", "be4"):
        model.update_running(_with_class(model.running[v], "best-effort", preempting_for="nb"))
    d = _rallypoint(model, [nb])
    assert not d.preemptions and _reasons(d)["nb"][0] == "Preempting" and "be3, be4" in _reasons(d)["nb"][1]
    model.unbind("be3")
    model.unbind("be4")
    d = _rallypoint(model, [nb])
    assert _where(d)["nb"] == ("h", (0,))
    model.bind(_with_class(running("nb", {"h": (0,)}, gpu_milli=500), "training-high"))
    # a notebook ranked below every share evicts nobody
    d = _rallypoint(model, [pending("low", 1, gpu_milli=500, priority_class="best-effort")])
    assert not d.preemptions and _reasons(d)["low"][0] == "Resources"


def test_a_mig_job_evicts_exactly_the_slices_overlapping_its_placement() -> None:
    model = cluster(_mig_nodes())

    def at(job_id: str, gpu: int, profile: str, start: int, cls: str) -> RunningJob:
        placement = TaskPlacement(
            task=0, node_id="h", gpus=(gpu,), mig=MigSlice(profile=profile, start=start)
        )
        job = RunningJob(
            id=job_id, team="t", gpus=1, placements=(placement,), start_time=0.0, mig_profile=profile
        )
        return _with_class(job, cls)

    for gpu in (0, 1):  # both MIG GPUs full: 3g at 0 best-effort, 3g at 4 production
        model.bind(at(f"low{gpu}", gpu, "3g.40gb", 0, "best-effort"))
        model.bind(at(f"prod{gpu}", gpu, "3g.40gb", 4, "production"))
    model.bind(running("whole", {"h": (2, 3, 4, 5, 6, 7)}, priority_class="production"))
    d = _rallypoint(model, [pending("big", 1, mig_profile="4g.40gb", priority_class="training-high")])
    assert [(p.victim_id, p.for_job) for p in d.preemptions] == [("low0", "big")]  # one victim, first GPU


def test_a_gang_evicts_the_shares_of_a_gpu_it_needs_and_holds_it_while_they_stop() -> None:
    model = cluster([Node(id="h", rack="r", gpu_type="H100", gpus=8, cpu_milli=64_000, memory_mib=1 << 20)])
    model.bind(running("prod", {"h": (0, 1, 2, 3, 4, 5)}, priority_class="production"))
    model.bind(_with_class(running("nb1", {"h": (7,)}, gpu_milli=300), "best-effort"))
    model.bind(_with_class(running("nb2", {"h": (7,)}, gpu_milli=300), "best-effort"))
    gang = pending("gang", 2, gpt=2, priority_class="training-high")
    d = _rallypoint(model, [gang])
    assert sorted(p.victim_id for p in d.preemptions) == ["nb1", "nb2"]
    assert _reasons(d)["gang"][0] == "Preempting"
    for v in ("nb1", "nb2"):
        model.update_running(_with_class(model.running[v], "best-effort", preempting_for="gang"))
    # while they stop, GPU 6 is held for the gang: a small job of a lower class does not get it
    d = _rallypoint(model, [gang, pending("small", 1, submit=1.0, priority_class="development")])
    assert not d.binds and not d.preemptions, d
    model.unbind("nb1")
    model.unbind("nb2")
    assert set(_where(_rallypoint(model, [gang]))["gang"][1]) == {6, 7}


def test_cpu_and_memory_quotas_admit_borrow_and_refuse_like_gpu_quotas() -> None:
    from rallypoint.core import Queue, Quota
    from rallypoint.core.types import CPU, MEMORY

    ns = [
        Node(id=f"n{i}", rack="r", gpu_type="h100", gpus=8, cpu_milli=64_000, memory_mib=1 << 20)
        for i in (0, 1)
    ]
    queues = (
        Queue(name="a", cohort="c", quotas=(Quota(nominal=16), Quota(gpu_type=CPU, nominal=8_000))),
        Queue(name="b", cohort="c", quotas=(Quota(nominal=16), Quota(gpu_type=CPU, nominal=4_000))),
    )

    def run(model: ClusterModel, jobs: list[PendingJob]) -> Decisions:
        return schedule(
            Snapshot(now=1.0, cluster=model, pending=tuple(jobs), queues=queues), policy_by_name("rallypoint")
        )

    model = cluster(ns)
    # a: 8,000 nominal + 4,000 b lends = 12,000 millicores at most, whatever its GPU quota says
    d = run(
        model,
        [
            pending("fits", 2, gpt=1, team="a", cpu_milli=6_000),
            pending("over", 1, submit=1.0, team="a", cpu_milli=1_000),
        ],
    )
    assert [b.job_id for b in d.binds] == ["fits"]
    code, message = _reasons(d)["over"]
    assert code == "QuotaExceeded" and "queue a uses 12000 of 8000 nominal millicores of CPU" in message, (
        message
    )
    # memory has no quota anywhere: unlimited; and b's own nominal is its own even while a borrows it
    d = run(
        model,
        [
            pending("mem", 1, team="b", memory_mib=500_000),
            pending("bcpu", 1, submit=1.0, team="b", cpu_milli=4_000),
        ],
    )
    assert sorted(b.job_id for b in d.binds) == ["bcpu", "mem"]
    model.bind(running("fits", {"n0": (0,), "n1": (0,)}, team="a", cpu_milli=6_000))
    assert model.usage[("a", CPU)] == 12_000 and ("a", MEMORY) not in model.usage


@pytest.mark.parametrize("policy", POLICIES)
def test_a_node_selector_keeps_every_kind_of_job_on_nodes_with_its_labels(policy: str) -> None:
    ns = [
        Node(id="a0", rack="r", gpu_type="H100", gpus=8, mig_gpus=(7,), labels=(("zone", "a"),)),
        Node(
            id="b0", rack="r", gpu_type="H100", gpus=8, mig_gpus=(7,), labels=(("ib", "hdr"), ("zone", "b"))
        ),
    ]
    model = cluster(ns)
    b = (("zone", "b"),)
    jobs = [
        pending("gang", 4, gpt=4, node_selector=b),
        pending("nb", 1, submit=1.0, gpu_milli=300, node_selector=b),
        pending("eval", 1, submit=2.0, mig_profile="1g.10gb", node_selector=b),
        pending("hdr", 1, submit=3.0, node_selector=(("ib", "hdr"), ("zone", "a"))),  # no node has both
    ]
    d = cycle_both_orders(model, jobs, policy)
    assert {b_.job_id: b_.placements[0].node_id for b_ in d.binds} == {"gang": "b0", "nb": "b0", "eval": "b0"}
    code, message = _reasons(d)["hdr"]  # can never run: rejected, never left to block a queue
    assert code == "GangTooLarge" and "node selector (ib=hdr, zone=a) allows have 0" in message, message
    # b0's whole GPUs are taken: a second gang for zone b waits though a0 has room
    full = cluster(ns, [running("x", {"b0": (0, 1, 2, 3, 4, 5, 6)})])
    d = cycle_both_orders(full, [pending("more", 1, node_selector=b)], policy)
    assert not d.binds and _reasons(d)["more"][0] == "Resources"
