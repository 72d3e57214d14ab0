"""Fail-slow nodes in the simulator: slowed gangs, straggler replacement, determinism, and episodes off."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from rallypoint.sim.cluster import cluster_from_obj
from rallypoint.sim.engine import SimOptions, SimResult, Simulator
from rallypoint.sim.failslow import Episode, EpisodeModel, FailSlow, gang_slowdown, node_episodes
from rallypoint.sim.run import resolve_policy
from rallypoint.sim.synth import synth_day
from rallypoint.sim.workload import Job


def run(jobs: list[Job], cluster: dict[str, Any], policy: str = "fifo", **kw: Any) -> SimResult:
    return Simulator(
        jobs, cluster_from_obj(cluster), policy, None, SimOptions(**kw), policy_obj=resolve_policy(policy)
    ).run()


def J(id: str, submit: float, gpus: int, dur: float, **kw: Any) -> Job:
    return Job(id=id, submit=submit, gpus=gpus, duration=dur, team="t", **kw)


ONE_NODE = {"generator": {"racks": 1, "nodes_per_rack": 1, "gpus_per_node": 8}}
N0 = "r000-n00"


def slow(node: str, start: float, duration: float, factor: float) -> Episode:
    return Episode(node=node, start=start, duration=duration, factor=factor)


def test_a_gang_on_a_slowed_node_finishes_later_by_the_factor() -> None:
    # 1,000 s of work; the node runs 2x slower during [100, 500): 400 s there do 200 s of work, so the job
    # needs 200 s more than without the episode and ends at 1,200; it held 8 GPUs for 200 s of extra time.
    fs = FailSlow(episodes=(slow(N0, 100, 400, 2.0),))
    res = run([J("a", 0, 8, 1000)], ONE_NODE, failslow=fs)
    r = res.records[0]
    assert (r.start, r.end) == (0, 1200)
    s = res.summary["failslow"]
    assert s["slow_gpu_hours"] == pytest.approx(8 * 200 / 3600)
    assert (s["episodes"], s["jobs_slowed"], s["replacements"]) == (1, 1, 0)


def test_the_slowest_node_sets_the_gang_pace() -> None:
    # A 16-GPU gang on two nodes; one node 1.5x, the other 3x slower over the same 300 s: the gang goes at
    # a third of its speed there, so the 300 s do 100 s of work and the job ends 200 s late.
    cl = {"generator": {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 8}}
    fs = FailSlow(episodes=(slow(N0, 0, 300, 1.5), slow("r000-n01", 0, 300, 3.0)))
    r = run([J("g", 0, 16, 600)], cl, failslow=fs).records[0]
    assert r.end == pytest.approx(800)


def test_an_episode_on_an_idle_node_changes_nothing() -> None:
    cl = {"generator": {"racks": 1, "nodes_per_rack": 2, "gpus_per_node": 8}}
    fs = FailSlow(episodes=(slow("r000-n01", 0, 5000, 4.0),))
    r = run([J("a", 0, 8, 1000)], cl, failslow=fs).records[0]
    assert (r.start, r.end) == (0, 1000)


# Four 8-GPU nodes; n03 is down for the first 100 s, so the 24-GPU gang submitted at 0 lands on n00-n02
# and n03 is the free node a replacement can move to. n00 turns 2x slow at 250 for a long time.
FOUR = {
    "generator": {"racks": 1, "nodes_per_rack": 4, "gpus_per_node": 8},
    "faults": {"checkpoint_overhead": 20, "events": [{"node": "r000-n03", "at": 0, "down_for": 100}]},
}
GANG = J("g", 0, 24, 1000, checkpoint_interval=100)
LONG = slow(N0, 250, 10_000, 2.0)


def test_without_replacement_the_gang_runs_slow_until_the_episode_ends() -> None:
    # 250 s of work by 250, then half speed: 750 s of work take 1,500 s, ending at 1,750.
    res = run([GANG], FOUR, failslow=FailSlow(episodes=(LONG,)))
    assert res.records[0].end == pytest.approx(1750)
    assert res.summary["failslow"]["slow_gpu_hours"] == pytest.approx(24 * 750 / 3600)


def test_replacement_restores_full_speed_and_costs_the_restart() -> None:
    # Detection 300 s after the slowdown (550): the rule flags n00 (8 slow ranks of 24, 2x > 1.43 x median).
    # Progress at 550 is 250 + 300 / 2 = 400; the last checkpoint (every 100 s of wall time) was at 500,
    # with 375 done, so 25 s x 24 GPUs are redone. Restart at 550 on n01-n03, 20 s restore, 625 s of work
    # at full speed: ends at 1,195 instead of 1,750.
    fs = FailSlow(episodes=(LONG,), replace=True)
    res = run([GANG], FOUR, failslow=fs)
    r = res.records[0]
    assert r.end == pytest.approx(1195)
    s = res.summary["failslow"]
    assert (s["replacements"], s["cordons"], s["jobs_replaced"]) == (1, 1, 1)
    assert s["restart_gpu_hours"] == pytest.approx((25 + 20) * 24 / 3600)
    assert s["slow_gpu_hours"] == pytest.approx(24 * 300 * 0.5 / 3600)
    assert r.lost_gpu_s == pytest.approx((25 + 20) * 24)


def test_the_live_rule_never_flags_a_gang_on_one_node() -> None:
    # Every rank of a one-node gang is equally slow: no healthy peer, no straggler; the node-level check
    # (factor above k) does flag it.
    cl = dict(FOUR, faults={"checkpoint_overhead": 20})
    job = J("a", 0, 8, 1000, checkpoint_interval=100)
    episode = (slow(N0, 250, 10_000, 2.0),)
    peers = run([job], cl, failslow=FailSlow(episodes=episode, replace=True))
    assert peers.records[0].end == pytest.approx(1750)
    assert peers.summary["failslow"]["checks_not_flagged"] == 1
    node = run([job], cl, failslow=FailSlow(episodes=episode, replace=True, detector="node"))
    assert node.records[0].end == pytest.approx(1195)


def test_a_mild_slowdown_below_the_threshold_is_not_replaced() -> None:
    mild = slow(N0, 250, 10_000, 1.3)  # below 1 / 0.7
    res = run([GANG], FOUR, failslow=FailSlow(episodes=(mild,), replace=True))
    assert res.summary["failslow"]["replacements"] == 0
    assert res.records[0].end == pytest.approx(250 + 750 * 1.3)


def test_a_cordoned_node_takes_no_new_gang_until_episode_end_plus_probation() -> None:
    # After the replacement n00 is cordoned until its episode ends (2,000) + probation (500). A second
    # 8-GPU job submitted at 600 finds n01-n03 busy with the restarted gang and must wait for n00's cordon
    # to end at 2,500 (the gang ends at 1,195 first and frees its nodes, so it starts then).
    ep = slow(N0, 250, 1750, 2.0)
    fs = FailSlow(episodes=(ep,), replace=True, probation_s=500)
    res = run([GANG, J("b", 600, 8, 100)], FOUR, failslow=fs)
    by = {r.id: r for r in res.records}
    assert by["b"].start == pytest.approx(1195)
    # with a gang that outlives the cordon, b gets n00 back exactly when the probation ends
    long_gang = J("g", 0, 24, 3000, checkpoint_interval=100)
    res = run([long_gang, J("b", 600, 8, 100)], FOUR, failslow=fs)
    by = {r.id: r for r in res.records}
    assert by["b"].start == pytest.approx(2500)


def _synth() -> tuple[list[Job], dict[str, Any]]:
    # 150 jobs over 6 h on 64 GPUs at load 1.1 (gangs up to 64 GPUs): queueing, preemptions, multi-node gangs
    jobs, _ = synth_day(150, 64, teams=4, load=1.1, span=6 * 3600.0, seed=3)
    cl = {
        "generator": {"racks": 2, "nodes_per_rack": 4, "gpus_per_node": 8},
        "faults": {"checkpoint_overhead": 60},
    }
    return jobs, cl


def _encode(res: SimResult) -> bytes:
    return msgspec.json.encode([res.records, {k: v for k, v in res.summary.items() if k != "sim_wall_s"}])


def test_same_seed_same_result_bit_for_bit() -> None:
    jobs, cl = _synth()
    fs = FailSlow(model=EpisodeModel(mean_gap_s=6 * 3600), seed=5, replace=True)
    a = run(jobs, cl, "rallypoint", failslow=fs)
    b = run(jobs, cl, "rallypoint", failslow=fs)
    assert _encode(a) == _encode(b)
    assert a.summary["failslow"]["episodes"] > 0
    c = run(jobs, cl, "rallypoint", failslow=msgspec.structs.replace(fs, seed=6))
    assert _encode(a) != _encode(c)


def test_episodes_off_changes_nothing() -> None:
    # No failslow, and failslow with no episodes at all, give the same records and summary bit for bit
    # (beside the failslow block itself), for a policy that preempts and with node failures on.
    jobs, cl = _synth()
    cl = dict(cl, faults={"checkpoint_overhead": 60, "node_mtbf": 86400, "repair_time": 1800})
    off = run(jobs, cl, "rallypoint", seed=2)
    empty = run(jobs, cl, "rallypoint", seed=2, failslow=FailSlow(episodes=()))
    assert msgspec.json.encode(off.records) == msgspec.json.encode(empty.records)
    strip = {"sim_wall_s", "failslow"}
    assert {k: v for k, v in off.summary.items() if k not in strip} == {
        k: v for k, v in empty.summary.items() if k not in strip
    }
    assert "failslow" not in off.summary


def test_generated_episodes_are_seeded_and_within_the_documented_ranges() -> None:
    m = EpisodeModel()
    eps = [e for _, e in zip(range(2000), node_episodes("n", 1, m), strict=False)]
    assert eps[:5] == [e for _, e in zip(range(5), node_episodes("n", 1, m), strict=False)]
    assert all(m.min_duration_s <= e.duration <= m.max_duration_s for e in eps)
    assert all(1.0 <= e.factor <= m.max_factor for e in eps)
    assert all(a.end <= b.start for a, b in itertools.pairwise(eps))  # one node: never overlapping
    mean_factor = sum(e.factor for e in eps) / len(eps)
    assert mean_factor == pytest.approx(1 + m.mean_extra, abs=0.03)
    gaps = [b.start - a.end for a, b in itertools.pairwise(eps)]
    assert sum(gaps) / len(gaps) == pytest.approx(m.mean_gap_s, rel=0.1)


def test_the_default_rate_slows_a_large_gang_by_about_falcons_figure() -> None:
    # the calibration check the docs cite: a 128-node gang under the default model, vs Falcon's 1.34x
    big = gang_slowdown(128, EpisodeModel())
    assert 1.2 < big < 1.45
    assert gang_slowdown(1, EpisodeModel()) < 1.01


def test_a_replacement_can_pay_its_own_restart_overhead() -> None:
    # as test_replacement_restores_full_speed_and_costs_the_restart, with a 50 s restore instead of the
    # cluster's 20 s: 30 s later, and 30 s x 24 GPUs more lost to the restart
    fs = FailSlow(episodes=(LONG,), replace=True, restart_overhead_s=50)
    res = run([GANG], FOUR, failslow=fs)
    assert res.records[0].end == pytest.approx(1225)
    assert res.summary["failslow"]["restart_gpu_hours"] == pytest.approx((25 + 50) * 24 / 3600)


def test_the_eval_section_compares_the_four_runs_on_the_same_jobs() -> None:
    import io

    from rallypoint.sim.failslow_eval import VARIANTS, gang_spans, render_section, straggler_run
    from rallypoint.sim.synth import synth_cluster
    from rallypoint.traces.convert import Converted

    jobs, queues = synth_day(150, 64, teams=4, load=1.1, span=6 * 3600.0, seed=3)
    conv = Converted(jobs=jobs, cluster=synth_cluster(64, nodes_per_rack=4), queues=queues)
    # a high rate, so that replacements happen on this small input
    rows = straggler_run(conv, EpisodeModel(mean_gap_s=3 * 3600), io.StringIO(), "synth")
    assert list(rows) == list(VARIANTS)
    plain = Simulator(
        jobs, conv.cluster, "rallypoint", queues, SimOptions(), policy_obj=resolve_policy("rallypoint")
    )
    assert rows[VARIANTS[0]]["jct"] == plain.run().summary["jct"]  # the baseline is the plain simulator
    slowed = rows[VARIANTS[1]]
    assert slowed["slow_gpu_hours"] > 0 and slowed["replacements"] == 0
    assert rows[VARIANTS[3]]["replacements"] > 0 and rows[VARIANTS[3]]["restart_gpu_hours"] > 0
    assert {r["hit_jobs"] for r in rows.values()} == {slowed["jobs_slowed"]}  # one cohort for every row
    info = {"jobs": len(jobs), "gpus": 64, "offered_load": 1.1}
    spans = gang_spans(conv)
    assert sum(n for n, _ in spans.values()) == len(jobs) and max(spans) == 8  # 64-GPU gangs: 8 nodes
    run_ = {"tag": "synth", "gap_days": 0.125, "info": info, "rows": rows, "spans": spans}
    text = "\n".join(render_section([run_], 4))
    assert "Jobs by tasks (nodes)" in text
    assert text.startswith("## 4. Stragglers")
    assert all(f"| {name} | 150/150 |" in text for name in VARIANTS)
    assert "share won back" in text


def test_a_cluster_file_can_turn_fail_slow_on() -> None:
    # the same scenario as test_replacement_restores_full_speed_and_costs_the_restart, from the cluster file
    # alone (what `rally sim --cluster` reads); unknown fields and nodes are refused
    from rallypoint.sim.cluster import ClusterError, cluster_to_obj

    episode = {"node": N0, "start": 250, "duration": 10_000, "factor": 2.0}
    cl = dict(FOUR, faults={**FOUR["faults"], "fail_slow": {"replace": True, "episodes": [episode]}})
    assert run([GANG], cl).records[0].end == pytest.approx(1195)
    assert cluster_to_obj(cluster_from_obj(cl))["faults"]["fail_slow"]["replace"] is True
    assert "fail_slow" not in cluster_to_obj(cluster_from_obj(FOUR))["faults"]
    for bad in ({"bogus": 1}, {"episodes": [dict(episode, node="nope")]}, {"detector": "psychic"}):
        with pytest.raises(ClusterError):
            cluster_from_obj(dict(FOUR, faults={"fail_slow": bad}))


def test_detection_waits_a_full_window_after_the_speeds_change_again() -> None:
    # n00 turns 2x slow at 250, then 3x at 400 (a second, overlapping episode): the check due at 550 is
    # stale and the rule runs at 700. Work by then: 250 + 150 / 2 + 300 / 3 = 425, also the checkpoint
    # taken at 700; restart with a 20 s restore and 575 s of work left: ends at 1,295.
    fs = FailSlow(episodes=(LONG, slow(N0, 400, 10_000, 3.0)), replace=True)
    res = run([GANG], FOUR, failslow=fs)
    assert res.records[0].end == pytest.approx(1295)
    assert res.summary["failslow"]["replacements"] == 1
    assert res.summary["failslow"]["restart_gpu_hours"] == pytest.approx(20 * 24 / 3600)
