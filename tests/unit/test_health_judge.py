"""The health monitor's signal judge, heartbeat by heartbeat: what it decides, when, and what it keeps.

Heartbeats as the agent sends them (one a second), the node views folded from the log, the decisions
folded back in, as the service does. Thresholds are detection's defaults unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from test_state_fold import node

from rallypoint.events import NodeUndrained
from rallypoint.health.detection import DetectionPolicy
from rallypoint.health.judge import HealthJudge
from rallypoint.health.stragglers import StragglerPolicy
from rallypoint.protocol import GpuSample, Heartbeat, NicSample, RankStatus
from rallypoint.state import ClusterState

T0 = 1_000_000.0
Gpu = Callable[[int, float], GpuSample]


def clean_gpu(index: int, t: float) -> GpuSample:
    return GpuSample(index=index, temperature_c=55.0, utilization=90.0, memory_used_mib=1000)


class World:
    """Four registered 2-GPU nodes, a judge, and the log its decisions go to."""

    def __init__(self, policy: DetectionPolicy | None = None) -> None:
        self.state = ClusterState()
        for i in range(4):
            self.state.apply(i + 1, node(f"n{i + 1}", gpus=2))
        self.judge = HealthJudge(policy or DetectionPolicy(), keep_every_s=2.0, scan_every_s=5.0)
        self.changes: list[tuple[float, str, str, str]] = []  # (at, node, previous, state)
        self.evidence: dict[tuple[str, str], tuple[str, ...]] = {}
        self.gpu: dict[str, Gpu] = {}
        self.nic: dict[str, Callable[[float], NicSample]] = {}
        self.ranks: dict[str, Callable[[float], tuple[RankStatus, ...]]] = {}

    def beat(self, node_id: str, t: float) -> Heartbeat:
        gpu = self.gpu.get(node_id, clean_gpu)
        nic = self.nic.get(node_id, lambda t: NicSample(name="ib0", link_up=True, speed_gbps=400.0))
        ranks = self.ranks.get(node_id, lambda t: ())
        return Heartbeat(
            node_id=node_id,
            agent_instance="a",
            at=t,
            gpus=(gpu(0, t), gpu(1, t)),
            nics=(nic(t),),
            ranks=ranks(t),
        )

    def run(self, start: float, end: float) -> None:
        t = start
        while t <= end:
            for node_id in sorted(self.state.nodes):
                self.judge.heard(self.beat(node_id, t))
            for decision in self.judge.judge(self.state.nodes, t):
                self.state.apply(self.state.last_seq + 1, decision.event)
                e = decision.event
                self.changes.append((t, e.node_id, e.previous, e.state))  # type: ignore[union-attr]
                self.evidence[(e.node_id, e.state)] = tuple(  # type: ignore[union-attr]
                    f"{x.signal} {x.subject}"
                    for x in e.evidence  # type: ignore[union-attr]
                )
            t += 1.0

    def states(self, node_id: str) -> list[str]:
        return [s for _, n, _, s in self.changes if n == node_id]

    def first(self, node_id: str, state: str) -> float:
        return min(t for t, n, _, s in self.changes if n == node_id and s == state)


def test_a_healthy_cluster_under_load_changes_nothing_and_keeps_nothing() -> None:
    world = World()
    world.run(T0, T0 + 600)
    assert world.changes == []
    assert list(world.judge.signals.watched()) == []  # clean nodes cost one sample each
    assert all(n.schedulable for n in world.state.nodes.values())


def test_uncorrectable_ecc_fails_the_node_at_once_with_its_evidence() -> None:
    world = World()
    world.gpu["n2"] = lambda i, t: msgspec.structs.replace(
        clean_gpu(i, t), ecc_uncorrectable=2 if i == 1 and t >= T0 + 10 else 0
    )
    world.run(T0, T0 + 20)
    assert world.states("n2") == ["failed"] and world.first("n2", "failed") == T0 + 10
    assert world.evidence[("n2", "failed")] == ("ecc_uncorrectable gpu 1",)
    n2 = world.state.nodes["n2"]
    assert n2.status == "drained" and "gpu 1 ecc_uncorrectable 2 >= 1" in n2.status_reason


def test_a_hard_fault_stays_until_an_operator_undrains_and_the_gpu_reads_clean() -> None:
    world = World()
    fault_until = T0 + 100
    world.gpu["n2"] = lambda i, t: msgspec.structs.replace(clean_gpu(i, t), xid=79 if t < fault_until else 0)
    world.run(T0, T0 + 3000)
    assert world.states("n2") == ["failed"]  # the XID is gone after 100 s; the node stays out
    undrain = NodeUndrained(node_id="n2", reason="GPU reseated", undrained_by="ops", at=T0 + 3000.5)
    world.state.apply(world.state.last_seq + 1, undrain)
    world.run(T0 + 3001, T0 + 3100)
    assert world.states("n2") == ["failed"] and world.state.nodes["n2"].schedulable


def test_a_corrected_ecc_storm_degrades_within_seconds_and_returns_after_window_and_probation() -> None:
    policy = DetectionPolicy(ecc_window_s=60.0, probation_s=120.0)
    world = World(policy)
    world.gpu["n3"] = lambda i, t: msgspec.structs.replace(
        clean_gpu(i, t), ecc_corrected=int(min(max(t - T0 - 10, 0), 40) * 5) if i == 0 else 0
    )  # 5 a second from t=10 to t=50
    world.run(T0, T0 + 400)
    assert world.states("n3") == ["suspect", "degraded", "healthy"]
    assert world.first("n3", "suspect") <= T0 + 13 and world.first("n3", "degraded") <= T0 + 31
    assert world.evidence[("n3", "degraded")] == ("ecc_corrected gpu 0",)
    # the last errors leave the 60 s window at ~t=110, then 120 s of probation
    assert T0 + 110 + 120 - 3 <= world.first("n3", "healthy") <= T0 + 110 + 120 + 3
    assert world.state.nodes["n3"].schedulable


def test_sustained_throttling_is_suspect_then_degraded_a_blip_is_nothing() -> None:
    world = World()
    world.gpu["n1"] = lambda i, t: msgspec.structs.replace(clean_gpu(i, t), throttle_thermal=i == 1)
    world.gpu["n4"] = lambda i, t: msgspec.structs.replace(
        clean_gpu(i, t), throttle_power_brake=T0 + 100 <= t < T0 + 120
    )  # a 20 s power brake: a checkpoint write's spike, not a fault
    world.run(T0, T0 + 400)
    assert world.states("n1") == ["suspect", "degraded"]
    assert world.first("n1", "suspect") <= T0 + 60 and world.first("n1", "degraded") <= T0 + 300
    assert world.states("n4") == []
    assert not world.state.nodes["n1"].schedulable and world.state.nodes["n1"].cordoned


def test_a_flapping_nic_degrades_the_node() -> None:
    world = World()
    world.nic["n2"] = lambda t: NicSample(
        name="ib0", link_up=not (t >= T0 + 30 and int(t) % 20 < 3), speed_gbps=400.0
    )  # down 3 s of every 20 from t=30
    world.run(T0, T0 + 120)
    assert world.states("n2") == ["suspect", "degraded"]
    assert world.first("n2", "degraded") <= T0 + 30 + 3 * 20
    assert world.evidence[("n2", "degraded")] == ("nic_flaps nic ib0",)


def test_a_port_that_trained_down_is_judged_against_the_speed_it_had() -> None:
    world = World(DetectionPolicy(nic_slow_window_s=30.0))
    world.nic["n4"] = lambda t: NicSample(name="ib0", speed_gbps=400.0 if t < T0 + 10 else 200.0)
    world.run(T0, T0 + 60)
    assert world.states("n4") == ["degraded"] and world.first("n4", "degraded") <= T0 + 10 + 30
    assert world.evidence[("n4", "degraded")] == ("nic_speed nic ib0",)


def _gang(slow_node: str, factor: float) -> Callable[[str], Callable[[float], tuple[RankStatus, ...]]]:
    """j1: one rank per node on n1..n4 (rank = node number - 1), stepping every second, 1 s a step except
    on ``slow_node`` (``factor`` s)."""

    def ranks(node_id: str) -> Callable[[float], tuple[RankStatus, ...]]:
        rank = int(node_id[1:]) - 1
        step_time = factor if node_id == slow_node else 1.0

        def at(t: float) -> tuple[RankStatus, ...]:
            step = int(t - T0)
            return (
                RankStatus(
                    job_id="j1", attempt=1, rank=rank, pid=1, step=step, step_time_s=step_time, progress_at=t
                ),
            )

        return at

    return ranks


def test_a_straggler_is_degraded_with_its_gangs_numbers() -> None:
    policy = DetectionPolicy(stragglers=StragglerPolicy(window_s=60.0))
    world = World(policy)
    gang = _gang("n3", 2.0)
    for n in ("n1", "n2", "n3", "n4"):
        world.ranks[n] = gang(n)
    world.run(T0, T0 + 120)
    assert world.states("n3") == ["degraded"]
    assert world.first("n3", "degraded") <= T0 + 60 + 5 + 1  # window, then the next scan
    assert world.evidence[("n3", "degraded")] == ("straggler job j1 rank 2",)
    assert all(world.states(n) == [] for n in ("n1", "n2", "n4"))


def test_a_gang_slow_alike_is_not_a_straggler() -> None:
    world = World(DetectionPolicy(stragglers=StragglerPolicy(window_s=60.0)))
    gang = _gang("none", 1.0)
    for n in ("n1", "n2", "n3", "n4"):
        world.ranks[n] = gang(n)
    world.run(T0, T0 + 200)
    assert world.changes == []


def test_a_restarted_monitor_goes_on_from_the_logs_verdict() -> None:
    # The log says n2 is degraded; a fresh judge (a restarted monitor) runs its probation from the clean
    # samples it hears, and returns it to service.
    # The windows of signals it has none of no longer than its throttling's (300 s, not 600): it is watched,
    # and judged every second, until T0 + 700 instead of T0 + 1000; the same decisions at the same times.
    policy = DetectionPolicy(probation_s=100.0, ecc_window_s=300.0, nvlink_window_s=300.0, nic_window_s=300.0)
    world = World(policy)
    world.gpu["n2"] = lambda i, t: msgspec.structs.replace(clean_gpu(i, t), throttle_hw_slowdown=t < T0 + 400)
    world.run(T0, T0 + 350)
    assert world.states("n2") == ["suspect", "degraded"]
    world.judge = HealthJudge(policy, keep_every_s=2.0, scan_every_s=5.0)
    world.run(T0 + 351, T0 + 1200)
    assert world.states("n2") == ["suspect", "degraded", "healthy"]
    assert world.state.nodes["n2"].schedulable


def test_flaps_no_sample_caught_still_count_through_the_link_downed_counter() -> None:
    # the port goes down and up between heartbeats: every sample reads up, the counter tells
    world = World()
    world.nic["n1"] = lambda t: NicSample(
        name="ib0", speed_gbps=400.0, link_downed=max(0, int(t - T0 - 20) // 5) if t >= T0 + 20 else 0
    )  # one flap every 5 s from t=25
    world.run(T0, T0 + 60)
    assert world.states("n1") == ["suspect", "degraded"]
    assert world.first("n1", "degraded") <= T0 + 25 + 2 * 5 + 1
    assert world.evidence[("n1", "degraded")] == ("nic_flaps nic ib0",)


def test_a_counter_that_grows_again_after_a_quiet_spell_is_judged_on_its_new_growth() -> None:
    # n2's corrected-ECC counter jumped by 95 at t=10 (suspect, not degraded), then stayed: the node is
    # no longer watched. It grows by 20 at t=900: judged from the clean beat just before, 20 is
    # suspect again (not 115 since t=10, which would be degraded). The other counters' windows as short as
    # the ECC one: unwatched from t=310 on, not t=610 (judging a watched node every second is the cost).
    world = World(
        DetectionPolicy(ecc_window_s=60.0, suspect_clear_s=30.0, nvlink_window_s=60.0, nic_window_s=60.0)
    )
    world.gpu["n2"] = lambda i, t: msgspec.structs.replace(
        clean_gpu(i, t), ecc_corrected=(95 if t >= T0 + 10 else 0) + (20 if t >= T0 + 900 else 0)
    )
    world.run(T0, T0 + 800)
    assert world.states("n2") == ["suspect", "healthy"]
    assert list(world.judge.signals.watched()) == []
    world.run(T0 + 801, T0 + 930)
    assert world.states("n2") == ["suspect", "healthy", "suspect"]
    assert {e.value for e in world.state.nodes["n2"].health_evidence} == {20}
    world.run(T0 + 931, T0 + 1000)
    assert world.states("n2") == ["suspect", "healthy", "suspect", "healthy"]
    assert world.state.nodes["n2"].health_evidence == ()
