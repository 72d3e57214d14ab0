"""How far behind the monitor reads the heartbeats (``readlag``); silence judged as of then (``liveness``).

Each node's clock differs from the monitor's by a constant; a backlog of the monitor's own delays every
heartbeat alike. The figure must see the backlog and neither the clocks nor one node with a wrong one.
"""

from __future__ import annotations

import pytest

from rallypoint.events import GpuInfo, NodeHeartbeatLost, NodeRecovered, NodeRegistered
from rallypoint.health import HealthPolicy, Hearing, assess
from rallypoint.health.readlag import ReadLag
from rallypoint.state import ClusterState

SKEW = {"n1": -0.8, "n2": 0.0, "n3": 2.5}  # node clock minus the monitor's
TRANSIT = 0.002


def _beats(lag: ReadLag, start: float, end: float, delay: float = 0.0, skew: dict[str, float] = SKEW) -> None:
    """Every node beats once a second from ``start`` to ``end`` (monitor's clock); each heartbeat is
    handled ``delay`` seconds after it arrived."""
    t = start
    while t <= end:
        for node, offset in skew.items():
            lag.note(node, sent=t + offset, received=t + TRANSIT + delay)
        t += 1.0


def test_steady_clocks_and_no_backlog_read_as_on_time() -> None:
    lag = ReadLag()
    assert lag.behind_s() == 0.0
    _beats(lag, 0.0, 30.0)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)


def test_a_backlog_reads_as_its_delay_and_clears_when_caught_up() -> None:
    lag = ReadLag()
    _beats(lag, 0.0, 10.0)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)
    _beats(lag, 11.0, 15.0, delay=4.0)
    assert lag.behind_s() == pytest.approx(4.0)
    assert lag.behind_s() == pytest.approx(4.0)  # nothing handled since: the last figure
    _beats(lag, 16.0, 20.0)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)


def test_one_node_with_a_clock_gone_wrong_is_outvoted() -> None:
    lag = ReadLag()
    _beats(lag, 0.0, 10.0)
    lag.behind_s()
    clocks = {**SKEW, "n2": -30.0}  # n2's clock stepped back 30 s: its heartbeats look 30 s late
    _beats(lag, 11.0, 20.0, skew=clocks)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)


def test_a_step_of_the_monitors_clock_is_forgotten_within_two_windows() -> None:
    lag = ReadLag(window_s=60.0)
    _beats(lag, 0.0, 30.0)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)
    # the monitor's clock jumps 5 s ahead: every heartbeat now looks 5 s late
    moved = {node: offset - 5.0 for node, offset in SKEW.items()}
    _beats(lag, 36.0, 50.0, skew=moved)
    assert lag.behind_s() == pytest.approx(5.0)
    _beats(lag, 51.0, 100.0, skew=moved)
    assert lag.behind_s() == pytest.approx(5.0)  # the least delays before the jump still count
    _beats(lag, 101.0, 200.0, skew=moved)
    assert lag.behind_s() == pytest.approx(0.0, abs=1e-9)


# -- silence judged as of what was read ------------------------------------------------------------

POLICY = HealthPolicy(unreachable_after_s=3.0, lost_after_s=8.0)


def _nodes(count: int) -> ClusterState:
    state = ClusterState()
    for i in range(count):
        gpus = (GpuInfo(index=0, uuid=f"n{i}-0", memory_mib=1, nvlink_domain=0),)
        event = NodeRegistered(
            node_id=f"n{i}", address="h", rack="r", gpu_type="H100", gpus=gpus, cpu_milli=1, memory_mib=1,
            agent_instance="a", at=0.0,
        )  # fmt: skip
        state.apply(state.last_seq + 1, event)
    return state


def test_nodes_whose_heartbeats_wait_unread_are_not_flagged_and_a_silent_one_is_later() -> None:
    """The monitor handles heartbeats 2.5 s late. Three of ten nodes were last heard 4 s ago (their
    later heartbeats still wait unread, since a backlog drains in arrival order), a fourth 6 s ago
    because it died: only the dead one is silent past 3 s as of what was read."""
    nodes = list(_nodes(10).nodes.values())
    now = 100.0
    last_seen = {n.node_id: now - 0.5 for n in nodes}
    last_seen.update({"n1": now - 4.0, "n2": now - 4.0, "n3": now - 4.0, "n4": now - 6.0})
    on_time = assess(nodes, last_seen, now, POLICY, hearing=Hearing(since=0.0))
    assert sorted(d.node_id for d in on_time.decisions) == ["n1", "n2", "n3", "n4"]
    behind = assess(nodes, last_seen, now, POLICY, hearing=Hearing(since=0.0, behind_s=2.5))
    assert [d.node_id for d in behind.decisions] == ["n4"]
    (lost,) = (d.event for d in behind.decisions)
    assert isinstance(lost, NodeHeartbeatLost) and lost.at == now  # judged as of then, recorded now
    assert not behind.held


def test_a_node_flagged_before_the_monitor_fell_behind_is_recovered_only_by_a_new_heartbeat() -> None:
    """n1 was flagged unreachable at 100 s, last heard at 96 s. At 101 s the monitor reads 5 s late:
    as of what it has read n1 was heard 0 s ago, but that is the heartbeat the verdict was made on."""
    state = _nodes(3)
    nodes = list(state.nodes.values())
    last_seen = {n.node_id: 99.5 for n in nodes} | {"n1": 96.0}
    (flagged,) = assess(nodes, last_seen, 100.0, POLICY, hearing=Hearing(since=0.0)).decisions
    state.apply(state.last_seq + 1, flagged.event)
    nodes = list(state.nodes.values())
    later = assess(nodes, last_seen, 101.0, POLICY, hearing=Hearing(since=0.0, behind_s=5.0))
    assert later.decisions == ()
    last_seen["n1"] = 100.8  # a heartbeat of n1 handled now
    (recovered,) = assess(nodes, last_seen, 101.0, POLICY, hearing=Hearing(since=0.0, behind_s=5.0)).decisions
    assert isinstance(recovered.event, NodeRecovered) and recovered.node_id == "n1"
