"""The twin test (issue 19): one workload through the simulator and, at the same instants, through the live
fold and bridge, gives byte-identical decisions (msgspec JSON of the core's ``Decisions``).

At every core call of the simulator, ``rallypoint.sim.twin`` brings a live ``ClusterState`` level with the
simulated world through the events the live services would append, runs the scheduler's cycle on it as
``services/scheduler/leader.py`` does (admissions, ``decide_live`` on the incrementally synced model) and
the audit's fresh rebuild, and compares the three encodings. The fold then folds the live writes
(``decision_writes``), not the simulator's, so the two worlds only stay level if the decisions agree.
"""

from __future__ import annotations

import itertools
import random
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
from gpujoins import GpuJoins

from rallypoint.events import ArrayMember, Dependency
from rallypoint.scheduling.queues import Queues, queues_from_obj
from rallypoint.sim.cluster import Cluster, cluster_from_obj
from rallypoint.sim.engine import SimOptions
from rallypoint.sim.twin import Twin, TwinReport, live_policy, run_twin
from rallypoint.sim.workload import Job, dependency_problem
from rallypoint.traces.convert import convert_philly

DATA = Path(__file__).resolve().parent / "data"

POLICIES = ("fifo", "easy-backfill", "las", "rallypoint")
ELASTIC = {"min_gpus": 4, "max_gpus": 16, "gpu_step": 4, "gpus_per_task": 4}


def J(id: str, submit: float, gpus: int, duration: float, team: str, **kw: object) -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=duration, team=team, **kw)  # type: ignore[arg-type]


def synthetic() -> tuple[list[Job], Cluster, Queues]:
    """Two teams in one cohort on 32 GPUs: time limits, priorities that preempt, an elastic gang that
    grows and shrinks, a gang larger than the cluster."""
    jobs = [
        J("a", 0.0, 16, 400.0, "t2", priority="best-effort", time_limit=500.0),
        J("b", 0.0, 8, 300.0, "t2", priority="development"),
        J("c", 10.0, 4, 30.0, "t1", priority="training-high", time_limit=40.0),
        J("d", 20.0, 8, 300.0, "t2", priority="best-effort", **ELASTIC),
        J("e", 30.0, 16, 100.0, "t1", priority="training-high"),
        J("f", 40.0, 64, 100.0, "t1"),
        J("g", 45.0, 8, 400.0, "t1", time_limit=600.0),
        J("h", 60.0, 24, 80.0, "t1", priority="training-high", time_limit=120.0),
        J("i", 70.0, 4, 20.0, "t2", time_limit=30.0),
        J("k", 80.0, 8, 100.0, "t2", priority="production"),  # never preempted
    ]
    cluster = cluster_from_obj({"generator": {"racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8}})
    queues = queues_from_obj(
        {
            "cohorts": [{"name": "all"}],
            "teams": [
                {"name": "t1", "nominal": 16, "cohort": "all", "borrowing_limit": 8},
                {"name": "t2", "nominal": 16, "cohort": "all"},
            ],
        }
    )
    return jobs, cluster, queues


def assert_identical(report: TwinReport) -> None:
    first = report.mismatches[0] if report.mismatches else None
    assert first is None, (
        f"{len(report.mismatches)} of {report.cycles} cycles differ; first at cycle {first.cycle}, "
        f"t={first.now}:\n sim   {first.sim}\n live  {first.live}\n audit {first.audit}"
    )
    assert report.ignored_binds == 0 and report.stale_decisions == 0
    # and one step earlier, what the core was given: every job, running gang, node, queue and class
    inputs = report.input_mismatches[0] if report.input_mismatches else None
    assert inputs is None, f"inputs differ at t={inputs.now}:\n sim  {inputs.sim}\n live {inputs.live}"
    assert report.rejected_sim == report.rejected_live
    assert report.identical


@pytest.mark.parametrize("policy", POLICIES)
def test_synthetic_workload_decides_the_same_in_the_simulator_and_live(policy: str) -> None:
    jobs, cluster, queues = synthetic()
    report = run_twin(jobs, cluster, policy, queues)
    assert_identical(report)
    assert report.cycles >= 5 and report.binds >= 8
    assert report.rejected_live == ["f"]  # larger than the cluster: rejected at admission on both sides


def seeded(seed: int) -> list[Job]:
    """25 jobs of both teams in bursts: every priority class, time limits, elastic gangs; enough
    contention that jobs are preempted, reclaimed, shrunk and grown again."""
    rng = random.Random(seed)
    classes = (None, "best-effort", "development", "training-standard", "training-high")
    jobs = []
    t = 0.0
    for k in range(25):
        t += float(rng.randint(0, 40))
        gpus = rng.choice((1, 2, 4, 8, 8, 16, 24))
        kw: dict[str, object] = {}
        if gpus >= 4 and rng.random() < 0.3:
            kw = {**ELASTIC, "max_gpus": max(gpus, 16)}
        duration = float(rng.randint(10, 300))
        if rng.random() < 0.6:
            kw["time_limit"] = limit = float(rng.choice((60, 120, 300, 600)))
            duration = min(duration, limit)
        team = rng.choice(("t1", "t2"))
        jobs.append(J(f"j{k:02d}", t, gpus, duration, team, priority=rng.choice(classes), **kw))
    return jobs


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("policy", POLICIES)
def test_seeded_contention_decides_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, queues = synthetic()
    report = run_twin(seeded(seed), cluster, policy, queues)
    assert_identical(report)
    assert report.cycles >= 20
    if policy == "rallypoint":  # what the comparison is for: resizes were decided (preemptions: below)
        assert report.resizes > 0
        # and no job is evicted again and again (seed 0 once livelocked a reclaim: 1,056 preemptions)
        assert report.preemptions < 25


def test_the_seeded_contention_preempts_under_rallypoint() -> None:
    # Across the seeds, preemptions were decided and compared (seed 0 has none since an elastic gang's
    # guaranteed minimum is ordered before borrowers: it binds into free GPUs instead of reclaiming)
    _, cluster, queues = synthetic()
    reports = [run_twin(seeded(seed), cluster, "rallypoint", queues) for seed in range(5)]
    assert all(r.identical for r in reports)
    assert sum(r.preemptions for r in reports) >= 3


def philly_slice() -> tuple[list[Job], Cluster, Queues]:
    """A Philly slice (tests/sim/data/philly_twin_slice.csv: four VCs, 2017-10-09 and -10, 123 jobs of
    1-16 GPUs) converted as ``rally trace convert philly`` converts it (a quota per VC in one cohort,
    priority classes drawn per job, ladder time limits), arrivals compressed to load 0.9 on 64 GPUs.
    On top: borrowing limits, a lending limit and an org whose limit caps two VCs; every third gang of
    4+ GPUs elastic (half to twice its size, in 4-GPU tasks)."""
    conv = convert_philly(
        DATA / "philly_twin_slice.csv",
        DATA / "philly_vc.csv",
        datetime(2017, 10, 9),
        2.0,
        target_load=0.9,
        mode="compress",
        gpus=64,
    )
    jobs = [
        msgspec.structs.replace(
            j, gpus_per_task=4, min_gpus=max(4, j.gpus // 2), max_gpus=2 * j.gpus, gpu_step=4
        )
        if j.gpus >= 4 and i % 3 == 0
        else j
        for i, j in enumerate(conv.jobs)
    ]
    assert conv.queues is not None
    team = {t.name: t for t in conv.queues.teams}
    queues = queues_from_obj(
        {
            "cohorts": [{"name": "philly"}],
            "orgs": [{"name": "lab", "limit": 48}],
            "teams": [
                {**msgspec.to_builtins(team["103959"]), "borrowing_limit": 8},
                {**msgspec.to_builtins(team["2869ce"]), "borrowing_limit": 16, "parent": "lab"},
                {**msgspec.to_builtins(team["6c71a0"]), "lending_limit": 8, "parent": "lab"},
                msgspec.to_builtins(team["ee9e8c"]),
            ],
        }
    )
    return jobs, conv.cluster, queues


@pytest.mark.parametrize("policy", ("las", "rallypoint"))
def test_philly_slice_with_quotas_elastic_gangs_and_preemption_decides_byte_for_byte(policy: str) -> None:
    jobs, cluster, queues = philly_slice()
    assert sum(j.min_gpus is not None for j in jobs) >= 10
    # a core call every 10 minutes while jobs wait (the default is every minute): the same comparison at
    # fewer instants, so the test takes seconds
    report = run_twin(jobs, cluster, policy, queues, SimOptions(tick=600.0))
    assert_identical(report)
    assert report.sim_summary["completed"] == len(jobs) == 123
    assert report.cycles >= 400 and report.preemptions > 0
    assert (
        report.checkpoints > 100
    )  # every 30 min (the converter's default): victims lose only the work since
    if policy == "rallypoint":  # the policy that enforces quotas and resizes elastic gangs
        assert report.codes.get("QuotaExceeded", 0) > 0
        assert report.resizes > 0 and report.preemption_reasons.get("reclaim", 0) > 0


def test_the_twin_catches_a_live_side_that_converts_differently() -> None:
    # the live scheduler run without the queue file the simulator enforces: the first cycle where a quota
    # matters differs, and the twin says where
    jobs, cluster, queues = synthetic()
    twin = Twin(jobs, cluster, "rallypoint", queues)
    twin.live.policy = live_policy("rallypoint", None)
    report = twin.run()
    assert report.mismatches and not report.identical
    first = report.mismatches[0]
    assert first.sim != first.live and first.live == first.audit
    # the quota's numbers (a job short of free GPUs too names them after the GPUs, under Resources)
    assert "cohort can lend" in first.sim and "cohort can lend" not in first.live


@pytest.mark.parametrize("policy", POLICIES)
def test_node_failures_as_the_simulator_models_them_decide_the_same(policy: str) -> None:
    # Two scripted failures and a restore overhead. The simulator requeues a gang whose node fails; the
    # twin tells the live fold so with the events of that live path (NodeLost, JobAttemptFailed with cause
    # infra, NodeRecovered). A live cluster would first try to repair the gang in place (JobInterrupted,
    # GangRepaired: scheduling/repair.py, outside the core's cycle), which the simulator does not model:
    # docs/simulator.md, "Sim and live: one decision path".
    _, _, queues = synthetic()
    cluster = cluster_from_obj(
        {
            "generator": {"racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8},
            "faults": {
                "checkpoint_overhead": 30,
                "events": [
                    {"node": "r000-n01", "at": 100, "down_for": 200},
                    {"node": "r001-n00", "at": 250, "down_for": 50},
                ],
            },
        }
    )
    report = run_twin(seeded(2), cluster, policy, queues)
    assert_identical(report)
    assert report.cycles >= 40


def test_a_queue_file_with_an_empty_class_list_means_the_same_to_both() -> None:
    # ``priority_classes: []`` is no class at all for the scheduler (every job's class counts 0); the
    # simulator used to read it as "the defaults" and ranked waiting jobs by class where the scheduler
    # ranks them alike (first difference: two QuotaExceeded jobs in the other order, at t=45)
    jobs, cluster, queues = synthetic()
    report = run_twin(jobs, cluster, "rallypoint", msgspec.structs.replace(queues, priority_classes=[]))
    assert_identical(report)
    assert report.cycles >= 5


@pytest.mark.parametrize("policy", POLICIES)
def test_gpu_types_and_nvlink_domains_decide_the_same(policy: str) -> None:
    # two GPU models, the smaller nodes in 2-GPU NVLink domains; jobs naming one type, a preference of
    # two, or a type the cluster lacks beside one it has
    cluster = cluster_from_obj(
        {
            "generator": [
                {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 8, "gpu_type": "A"},
                {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 4, "gpu_type": "B", "prefix": "b",
                 "nvlink_domain": 2},
            ]
        }
    )  # fmt: skip
    _, _, queues = synthetic()
    rng = random.Random(7)
    types = (None, "A", "B", "A|B", "B|A", "C|A")
    jobs = [msgspec.structs.replace(j, gpu_type=rng.choice(types)) for j in seeded(3)]
    report = run_twin(jobs, cluster, policy, queues)
    assert_identical(report)
    assert report.cycles >= 20 and report.binds >= 20
    # the rejection rule from the core's typed codes: gangs no node shape can hold (GangTooLarge) are
    # rejected on both sides, the same ones (assert_identical)
    assert report.codes.get("GangTooLarge", 0) > 0 and report.rejected_live


def with_dependencies(seed: int) -> list[Job]:
    """The seeded contention with dependencies of every kind on earlier jobs, singletons sharing a name,
    and a job larger than the cluster that others wait on (after-not-ok met, after-ok never)."""
    jobs = seeded(seed)
    rng = random.Random(seed + 100)
    kinds = ("after", "after-ok", "after-not-ok", "after-any")
    never = (Dependency(kind="after-ok", job_id="huge"),)
    out = [J("huge", 0.0, 64, 10.0, "t1"), J("doomed", 0.0, 4, 10.0, "t2", depends_on=never)]
    for k, job in enumerate(jobs):
        extra: dict[str, object] = {}
        if k and rng.random() < 0.5:
            earlier = rng.choice([j.id for j in jobs[:k]] + ["huge"])
            extra["depends_on"] = (Dependency(kind=rng.choice(kinds), job_id=earlier),)  # type: ignore[arg-type]
        if rng.random() < 0.3:
            extra.update(name="nightly", singleton=rng.random() < 0.7)
        out.append(msgspec.structs.replace(job, **extra))
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ("easy-backfill", "rallypoint"))
def test_dependencies_and_singletons_hold_the_same_jobs_in_the_simulator_and_live(
    policy: str, seed: int
) -> None:
    _, cluster, queues = synthetic()
    jobs = with_dependencies(seed)
    assert dependency_problem(jobs) is None
    twin = Twin(jobs, cluster, policy, queues)
    report = twin.run()
    assert_identical(report)
    sim = twin.sim
    ends = {r.id: r for r in sim.records}
    failed = set(sim.holds.failed)
    assert failed and len(ends) + len(sim.rejected) + len(failed) == len(jobs)  # every job ended somehow
    for job in jobs:
        for dep in job.depends_on:
            if job.id not in ends:
                continue
            before = ends.get(dep.job_id)
            if dep.kind == "after-ok":
                assert before is not None and ends[job.id].start >= before.end
            elif dep.kind == "after":
                assert before is not None and ends[job.id].start >= before.start
            elif dep.kind == "after-not-ok":
                assert dep.job_id in sim.rejected or dep.job_id in failed
    # a singleton never overlaps an earlier job of its team and name: checked among the singletons
    for team in ("t1", "t2"):
        runs = sorted(
            (ends[j.id].start, ends[j.id].end)
            for j in jobs
            if j.singleton and j.team == team and j.id in ends
        )
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(runs)), runs
    # live, the job controller fails the same jobs (the twin appends its JobFailed)
    assert {j.job_id for j in twin.live.state.jobs.values() if j.state == "failed"} == failed
    assert "doomed" in failed


def with_arrays(seed: int) -> list[Job]:
    """The seeded contention plus two throttled arrays arriving in bursts (the API's expansion of
    ``--array 0-7%2`` and ``--array 0-4%3``), some members waiting on other jobs."""
    rng = random.Random(seed + 200)
    jobs = seeded(seed)
    for array_id, count, limit, at in (("arr", 8, 2, 15.0), ("brr", 5, 3, 120.0)):
        for i in range(count):
            member = ArrayMember(array_id=array_id, index=i, count=count, max_running=limit)
            extra: dict[str, object] = {}
            if rng.random() < 0.2:
                extra["depends_on"] = (Dependency(kind="after", job_id=jobs[0].id),)
            gpus = rng.choice((1, 2, 4))
            jobs.append(
                J(f"{array_id}_{i}", at, gpus, float(rng.randint(20, 200)), "t1", array=member, **extra)
            )
    jobs.sort(key=lambda j: j.submit)
    return jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ("easy-backfill", "rallypoint"))
def test_array_limits_hold_the_same_members_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, queues = synthetic()
    jobs = with_arrays(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    ends = {r.id: r for r in twin.sim.records}
    assert all(j.id in ends for j in jobs if j.array is not None)  # every member ran to its end
    if policy == "easy-backfill":  # nothing is preempted: a member holds GPUs from its start to its end
        for array_id, limit in (("arr", 2), ("brr", 3)):
            runs = [
                (ends[j.id].start, ends[j.id].end) for j in jobs if j.array and j.array.array_id == array_id
            ]
            at_once = max(sum(1 for s, e in runs if s <= t < e) for t, _ in runs)
            assert at_once <= limit, (array_id, runs)  # never passed
            assert array_id != "arr" or at_once == limit, runs  # and it binds (8 small members at once)


def shared_cluster() -> Cluster:
    """Four nodes of 8 GPUs and 16 cores each (the sharing cases')."""
    return cluster_from_obj(
        {"generator": {"racks": 2, "nodes_per_rack": 2, "gpus_per_node": 8, "cpu": 16000, "memory": 1 << 20}}
    )


def mig_cluster() -> Cluster:
    """Two H100 nodes, GPUs 0 and 1 of each in MIG mode (the MIG cases')."""
    gen = {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 8, "gpu_type": "H100", "mig_gpus": [0, 1]}
    return cluster_from_obj({"generator": gen})


def with_sharing(seed: int) -> list[Job]:
    """Notebooks on fractions of a GPU, CPU-heavy gangs and plain gangs arriving together on nodes of 16
    cores each: shares pack, CPU runs out before GPUs on some nodes, and both release as jobs end."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for i in range(40):
        kind = rng.choice(("fraction", "fraction", "cpu", "whole"))
        submit, duration = float(rng.randrange(0, 200)), float(rng.randrange(20, 200))
        if kind == "fraction":
            share = {
                "gpu_milli": rng.choice((100, 250, 300, 500, 700)),
                "cpu_milli": rng.choice((0, 1000, 4000)),
            }
            priority = rng.choice(("best-effort", "development", "training-high"))
            jobs.append(
                J(f"nb{i}", submit, 1, duration, rng.choice(("t1", "t2")), priority=priority, **share)
            )
        elif kind == "cpu":
            gpus = rng.choice((1, 2, 4, 8))
            jobs.append(
                J(f"cpu{i}", submit, gpus, duration, "t1", cpu_milli=rng.choice((6000, 12000)), memory_mib=64)
            )
        else:
            jobs.append(
                J(
                    f"w{i}",
                    submit,
                    rng.choice((2, 8, 16)),
                    duration,
                    "t2",
                    time_limit=400.0,
                    priority="training-high",
                )
            )
    return sorted(jobs, key=lambda j: j.submit)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_fractions_and_cpu_requests_decide_the_same_in_the_simulator_and_live(
    policy: str, seed: int, gpu_joins: GpuJoins
) -> None:
    _, _, queues = synthetic()
    cluster = shared_cluster()
    jobs = with_sharing(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    ends = {r.id: r for r in twin.sim.records}
    assert all(j.id in ends for j in jobs)  # every job ran to its end
    assert gpu_joins.shares, "no notebook ever shared a GPU: the case tests nothing about sharing"


def with_mig(seed: int) -> list[Job]:
    """MIG slices of every H100 profile beside whole-GPU gangs and notebooks, arriving together."""
    rng = random.Random(seed)
    profiles = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    jobs: list[Job] = []
    for i in range(40):
        submit, duration = float(rng.randrange(0, 200)), float(rng.randrange(20, 200))
        kind = rng.random()
        if kind < 0.6:
            priority = rng.choice(("best-effort", "training-high"))
            profile = rng.choice(profiles)
            jobs.append(J(f"mig{i}", submit, 1, duration, "t1", mig_profile=profile, priority=priority))
        elif kind < 0.8:
            jobs.append(J(f"nb{i}", submit, 1, duration, "t1", gpu_milli=rng.choice((250, 500))))
        else:
            # six whole GPUs a node (two of eight run MIG): tasks of at most six
            jobs.append(
                J(f"w{i}", submit, rng.choice((2, 6, 12)), duration, "t2", time_limit=400.0, gpus_per_task=2)
            )
    return sorted(jobs, key=lambda j: j.submit)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_mig_slices_decide_the_same_in_the_simulator_and_live(
    policy: str, seed: int, gpu_joins: GpuJoins
) -> None:
    _, _, queues = synthetic()
    cluster = mig_cluster()
    jobs = with_mig(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    ends = {r.id: r for r in twin.sim.records}
    assert all(j.id in ends for j in jobs)  # every job ran to its end, slices included
    assert gpu_joins.slices, "no two slices ever shared a MIG GPU: the case tests nothing about MIG layouts"


def test_shares_and_slices_are_preempted_in_both_worlds_alike() -> None:
    """The workloads above do make notebooks and evals preempt lower-ranked shares and slices (so the twin
    cases compare real part preemptions), and both worlds agree on each."""
    _, _, queues = synthetic()
    shared = shared_cluster()
    mig = mig_cluster()
    for workload, cluster, part in ((with_sharing, shared, "gpu_milli"), (with_mig, mig, "mig_profile")):
        preempted = 0
        for seed in range(3):
            jobs = workload(seed)
            twin = Twin(jobs, cluster, "rallypoint", queues)
            assert_identical(twin.run())
            ends = {r.id: r for r in twin.sim.records}
            preempted += sum(ends[j.id].preemptions for j in jobs if getattr(j, part) is not None)
        assert preempted, f"no {part} job was ever preempted: the cases compare no part preemption"


@pytest.mark.parametrize("policy", ("easy-backfill", "rallypoint"))
def test_cpu_and_memory_quotas_decide_the_same_in_the_simulator_and_live(policy: str) -> None:
    queues = queues_from_obj(
        {
            "cohorts": [{"name": "all"}],
            "teams": [
                {"name": "t1", "nominal": 16, "cohort": "all", "cpus": 12, "memory_gib": 1},
                {"name": "t2", "nominal": 16, "cohort": "all", "cpus": 8},
            ],
        }
    )
    twin = Twin(with_sharing(0), shared_cluster(), policy, queues)
    assert_identical(twin.run())


def with_suspensions(seed: int) -> list[Job]:
    """The synthetic contention with some jobs suspended by their team for a while (running or waiting
    when it happens), others suspended and never resumed."""
    rng = random.Random(seed)
    jobs = []
    for job in seeded(seed):
        roll = rng.random()
        if roll < 0.4:
            at = job.submit + rng.choice((5.0, 30.0, 90.0))
            job = msgspec.structs.replace(job, suspend_at=at, resume_at=at + rng.choice((10.0, 60.0)))
        elif roll < 0.45:
            job = msgspec.structs.replace(job, suspend_at=job.submit + 20.0)
        jobs.append(job)
    return jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_suspend_and_resume_decide_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, queues = synthetic()
    jobs = with_suspensions(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    ends = {r.id for r in twin.sim.records}
    never_resumed = [j.id for j in jobs if j.suspend_at is not None and j.resume_at is None]
    suspended = [
        j.id for j in jobs if twin.live.state.jobs.get(j.id) and twin.live.state.jobs[j.id].suspended_s
    ]
    assert suspended, "no job was ever suspended and resumed: the case tests nothing"
    assert all(twin.live.state.jobs[j].state == "suspended" for j in never_resumed if j not in ends), [
        twin.live.state.jobs[j].state for j in never_resumed
    ]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("policy", POLICIES)
def test_node_selectors_decide_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, _, queues = synthetic()
    cluster = cluster_from_obj(
        {
            "nodes": [
                {"id": f"n{i}", "rack": f"r{i // 2}", "gpus": 8, "labels": {"zone": "a" if i < 2 else "b"}}
                for i in range(4)
            ]
        }
    )
    rng = random.Random(seed)
    jobs = [
        msgspec.structs.replace(job, node_selector={"zone": rng.choice("ab")}) if rng.random() < 0.5 else job
        for job in seeded(seed)
    ]
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    placed = {r.id for r in twin.sim.records}
    assert any(j.node_selector for j in jobs if j.id in placed)


def with_services(seed: int) -> list[Job]:
    """The seeded contention with a third of the jobs turned into services (whole runs of 30 to 120 s, each
    ending in an exit and a restart after the backoff), some of the lowest class, among training that
    outranks them; team t1 reserves 3 GPUs for its services, and two of 2 GPUs each arrive first, so one
    of them waits for that room (``QuotaExceeded``, "service capacity") while the other runs."""
    rng = random.Random(seed)
    jobs = [J(f"svc-{x}", 0.0, 2, 60.0, "t1", kind="service") for x in "ab"]
    for job in seeded(seed):
        if rng.random() < 0.33 and job.min_gpus is None and job.gpus <= 8:
            job = msgspec.structs.replace(
                job,
                kind="service",
                time_limit=None,
                duration=float(rng.randint(30, 120)),
                priority=rng.choice(("best-effort", None)),
            )
        jobs.append(job)
    return jobs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES)
def test_services_decide_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, _ = synthetic()
    queues = queues_from_obj(
        {
            "cohorts": [{"name": "all"}],
            "teams": [
                {"name": "t1", "nominal": 16, "cohort": "all", "borrowing_limit": 8, "service_gpus": 3},
                {"name": "t2", "nominal": 16, "cohort": "all"},
            ],
        }
    )
    jobs = with_services(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    services = [j.id for j in jobs if j.kind == "service"]
    assert services and not {r.id for r in twin.sim.records} & set(services), "a service never completes"
    assert any(twin.sim.jobs[s].restarts for s in services), "no service ever restarted: nothing compared"
    live = twin.live.state.jobs
    assert all(live[s].state != "completed" and twin.sim.jobs[s].preemptions == 0 for s in services)
    # each restart the live side saw was the job controller's user failure (an exit after the last cycle
    # is not told to it: no cycle follows)
    assert all(live[s].user_failures <= twin.sim.jobs[s].restarts for s in services if s in live)
    assert sum(live[s].user_failures for s in services if s in live) > 0


def with_sessions(seed: int) -> list[Job]:
    """The seeded contention with interactive sessions arriving among it (``rally run --pty``): a GPU or a
    quarter of one each, for one to five minutes, under their own class (they name none), which ranks
    above standard training and is never preempted."""
    rng = random.Random(seed)
    jobs = seeded(seed)
    for x in range(6):
        share: dict[str, object] = {"gpu_milli": 250} if x % 2 else {}
        submit, duration, team = (
            rng.uniform(0.0, 300.0),
            float(rng.randint(60, 300)),
            rng.choice(("t1", "t2")),
        )
        jobs.append(J(f"tty-{x}", submit, 1, duration, team, kind="interactive", **share))
    return jobs


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("policy", POLICIES)
def test_interactive_sessions_decide_the_same_in_the_simulator_and_live(policy: str, seed: int) -> None:
    _, cluster, queues = synthetic()
    jobs = with_sessions(seed)
    twin = Twin(jobs, cluster, policy, queues)
    assert_identical(twin.run())
    sessions = [j.id for j in jobs if j.kind == "interactive"]
    live = twin.live.state.jobs
    assert all(live[s].spec.priority == "interactive" == twin.sim.jobs[s].pclass for s in sessions)
    assert all(twin.sim.jobs[s].preemptions == 0 for s in sessions), "a session was preempted"
    started = {r.id: r.start - r.submit for r in twin.sim.records}
    assert set(sessions) <= started.keys(), "every session got its GPU"
    if policy == "rallypoint":  # its class outranks the training in its way: each starts as it arrives
        assert all(started[s] == 0.0 for s in sessions), {s: started[s] for s in sessions}
