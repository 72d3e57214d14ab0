"""The health monitor's pure rules: thresholds, the grace after hearing again, and the mass-silence rule.

A small world folds the monitor's own decisions back into a ``ClusterState`` (as the service does), and
scenarios are timelines: who beats when, when the monitor is connected, what it has decided by the end.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rallypoint.events import GpuInfo, NodeDrained, NodeHeartbeatLost, NodeLost, NodeRegistered
from rallypoint.health import HealthPolicy, Hearing, assess
from rallypoint.protocol import GpuSample, Heartbeat
from rallypoint.state import ClusterState

#: The local cluster's settings (LOCAL_SERVICE_ARGS): 3 s silent -> unreachable, 8 s -> lost.
LOCAL = HealthPolicy(unreachable_after_s=3.0, lost_after_s=8.0)
T0 = 1000.0


class World:
    """Nodes registered at T0, a monitor listening since T0; ``tick`` assesses and folds what it decides."""

    def __init__(self, count: int, policy: HealthPolicy = LOCAL) -> None:
        self.state = ClusterState()
        self.policy = policy
        self.last_seen: dict[str, float] = {}
        self.beats: dict[str, Heartbeat] = {}
        self.since = T0
        self.connected = True
        self.held: list[str] = []
        self.decided: list[tuple[float, str, str]] = []  # (at, event type, node)
        for i in range(count):
            self.register(f"n{i + 1}")

    def register(self, node_id: str) -> None:
        gpus = (GpuInfo(index=0, uuid=f"{node_id}-0", memory_mib=1, nvlink_domain=0),)
        event = NodeRegistered(
            node_id=node_id, address="h", rack="r", gpu_type="H100", gpus=gpus, cpu_milli=1, memory_mib=1,
            agent_instance="a", at=T0,
        )  # fmt: skip
        self.state.apply(self.state.last_seq + 1, event)

    def beat(self, node_id: str, at: float, temperature: float = 40.0) -> None:
        gpus = (GpuSample(index=0, temperature_c=temperature, utilization=0.0, memory_used_mib=0),)
        self.beats[node_id] = Heartbeat(node_id=node_id, agent_instance="a", at=at, gpus=gpus)
        self.last_seen[node_id] = at

    def tick(self, now: float) -> None:
        hearing = Hearing(connected=self.connected, since=self.since)
        nodes = list(self.state.nodes.values())
        assessment = assess(nodes, self.last_seen, now, self.policy, hearing=hearing)
        if assessment.held:
            self.held.append(assessment.held)
        for decision in assessment.decisions:
            self.state.apply(self.state.last_seq + 1, decision.event)
            self.decided.append((now, type(decision.event).__name__, decision.node_id))

    def run(self, start: float, end: float, beating: Callable[[str, float], bool], step: float = 0.5) -> None:
        """Every node beats once a second while ``beating(node, t)``; the monitor ticks every ``step``."""
        t = start
        while t <= end + 1e-9:
            for node_id in self.state.nodes:
                if abs(t - round(t)) < 1e-9 and beating(node_id, t):
                    self.beat(node_id, t)
            self.tick(t)
            t += step

    def statuses(self) -> dict[str, str]:
        return {n: v.status for n, v in sorted(self.state.nodes.items())}

    def events(self, kind: str) -> list[str]:
        return [node for _, k, node in self.decided if k == kind]


def always(node_id: str, t: float) -> bool:
    return True


# --- thresholds --------------------------------------------------------------------------------------


def test_a_node_silent_past_the_thresholds_is_unreachable_then_lost_and_recovers_when_it_beats() -> None:
    world = World(4)
    world.run(T0, T0 + 20, lambda n, t: n != "n3" or t < T0 + 5)
    lost_at = {k: at for at, k, node in world.decided if node == "n3"}
    assert lost_at["NodeHeartbeatLost"] == pytest.approx(T0 + 7.5)  # silent > 3 s after its beat at T0+4
    assert lost_at["NodeLost"] == pytest.approx(T0 + 12.5)  # silent > 8 s
    assert world.statuses() == {"n1": "up", "n2": "up", "n3": "lost", "n4": "up"} and world.held == []
    world.run(T0 + 21, T0 + 22, always)
    assert world.events("NodeRecovered") == ["n3"] and world.statuses()["n3"] == "up"


def test_a_monitor_that_starts_gives_every_node_a_full_timeout_and_recovers_no_node_it_never_heard() -> None:
    world = World(2)
    world.state.apply(10, NodeLost(node_id="n2", reason="before we started", at=T0))
    world.since = T0 + 100  # this monitor started long after the nodes last spoke
    world.tick(T0 + 102)
    assert world.decided == []  # no verdict for n1 yet, and no recovery for n2: it was never heard
    world.tick(T0 + 103.5)
    assert world.events("NodeHeartbeatLost") == ["n1"] and world.events("NodeRecovered") == []


# --- deaf: no verdict --------------------------------------------------------------------------------


def test_while_disconnected_no_verdict_at_all() -> None:
    world = World(4)
    world.connected = False
    world.beat("n1", T0)
    world.run(T0 + 1, T0 + 60, lambda n, t: False)
    assert world.decided == [] and world.statuses() == dict.fromkeys(["n1", "n2", "n3", "n4"], "up")
    assert world.held and "not connected" in world.held[0]


def test_after_a_reconnect_every_node_gets_a_full_timeout() -> None:
    world = World(4)
    world.run(T0, T0 + 5, always)
    world.connected = False
    world.run(T0 + 6, T0 + 46, lambda n, t: False)  # a 40 s outage: the monitor hears nothing
    world.connected, world.since = True, T0 + 46.5  # reconnected; n1..n3 come back 2 s later, n4 never
    world.run(T0 + 46.5, T0 + 70, lambda n, t: n != "n4" and t >= T0 + 48.5)
    assert world.events("NodeHeartbeatLost") == ["n4"] and world.events("NodeLost") == ["n4"]
    first = min(at for at, k, node in world.decided if node == "n4")
    assert first > T0 + 46.5 + LOCAL.unreachable_after_s  # a full timeout from the reconnect
    assert world.statuses() == {"n1": "up", "n2": "up", "n3": "up", "n4": "lost"}


# --- mass silence --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "silent", "held"),
    [
        (4, 4, True),  # everything at once: the monitor's subscription, or the bus, not four machines
        (4, 3, True),
        (4, 2, False),  # half is not more than half: a rack of two may really fail
        (2, 2, True),
        (1, 1, False),  # one node cannot tell: fewer than mass_silence_min_nodes
        (10, 6, True),
        (10, 5, False),
    ],
)
def test_more_than_half_of_the_nodes_silent_at_once_holds_every_verdict(
    count: int, silent: int, held: bool
) -> None:
    world = World(count)
    quiet = {f"n{i + 1}" for i in range(silent)}
    world.run(T0, T0 + 30, lambda n, t: n not in quiet or t < T0 + 5)
    if held:
        assert world.decided == [] and world.held
        assert f"{silent} of {count} nodes went silent" in world.held[-1]
    else:
        assert sorted(world.events("NodeLost")) == sorted(quiet) and world.held == []


def test_the_hold_starts_before_the_first_verdict_could_even_with_beats_spread_over_a_second() -> None:
    world = World(4)
    last_beat = {"n1": T0 + 4, "n2": T0 + 4, "n3": T0 + 5, "n4": T0 + 5}
    world.run(T0, T0 + 30, lambda n, t: t <= last_beat[n], step=0.25)
    assert world.decided == [] and len(world.held) > 80


def test_silences_that_began_far_apart_are_judged_one_by_one() -> None:
    world = World(4)
    dies = {"n1": T0 + 5, "n2": T0 + 25, "n3": T0 + 45}
    world.run(T0, T0 + 70, lambda n, t: n not in dies or t < dies[n])
    assert world.events("NodeLost") == ["n1", "n2", "n3"] and world.held == []


def test_lost_and_drained_nodes_are_not_watched() -> None:
    world = World(4)
    world.state.apply(10, NodeLost(node_id="n1", reason="x", at=T0))
    world.state.apply(11, NodeDrained(node_id="n2", reason="x", at=T0))
    world.run(T0, T0 + 30, lambda n, t: n in ("n3", "n4") and t < T0 + 5)  # the two watched ones go quiet
    assert world.events("NodeHeartbeatLost") == [] and "2 of 2 nodes" in world.held[-1]


def test_during_a_hold_a_node_heard_again_recovers() -> None:
    # What a heartbeat says (a GPU fault) is judged elsewhere (test_health_judge.py), hold or not.
    world = World(4)
    world.state.apply(10, NodeHeartbeatLost(node_id="n1", last_seen=T0, at=T0))
    world.run(T0, T0 + 20, lambda n, t: (n in ("n1", "n2") and t < T0 + 1) or n == "n1")
    world.beat("n1", T0 + 20.5, temperature=99.0)
    world.tick(T0 + 20.5)
    assert world.held and world.events("NodeRecovered") == ["n1"]
    world.tick(T0 + 21)
    assert world.events("NodeDrained") == []


def test_when_the_hold_ends_the_stragglers_get_a_full_timeout() -> None:
    world = World(4)
    world.run(T0, T0 + 5, always)
    world.run(T0 + 6, T0 + 25, lambda n, t: False)  # connected, but nothing heard for 20 s: held
    assert world.held and world.decided == []
    world.since = T0 + 26  # the shell's part: the end of a hold is a new start
    world.run(T0 + 26, T0 + 45, lambda n, t: n != "n4")
    assert world.events("NodeLost") == ["n4"]
    assert min(at for at, k, node in world.decided if node == "n4") > T0 + 26 + LOCAL.unreachable_after_s


def test_a_mass_silence_that_outlasts_the_hold_limit_is_believed() -> None:
    policy = HealthPolicy(unreachable_after_s=3.0, lost_after_s=8.0, mass_silence_max_hold_s=30.0)
    world = World(4, policy)
    world.run(T0, T0 + 60, lambda n, t: n == "n4" or t < T0 + 5)
    assert sorted(world.events("NodeLost")) == ["n1", "n2", "n3"]
    assert min(at for at, _, _ in world.decided) > T0 + 4 + 30  # the last beat + the hold limit
