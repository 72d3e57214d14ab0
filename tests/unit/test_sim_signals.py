"""The simulated backend's health signals: throttle reasons, counter storms, NIC faults, slowdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.agent import SimulatedGpus, parse_fault_spec
from rallypoint.agent.backend import GpuBackend
from rallypoint.protocol import NicSample


def test_a_healthy_node_reports_clean_signals() -> None:
    gpus = SimulatedGpus("n", 2, nics=2, nic_speed_gbps=200.0)
    assert isinstance(gpus, GpuBackend)
    for _ in range(3):
        s = gpus.sample()
        assert all(g.ecc_corrected == 0 and g.nvlink_errors == 0 for g in s)
        assert not any(g.throttled or g.throttle_thermal or g.throttle_power_brake for g in s)
        assert gpus.nics() == (
            NicSample(name="ib0", link_up=True, speed_gbps=200.0, errors=0),
            NicSample(name="ib1", link_up=True, speed_gbps=200.0, errors=0),
        )
    assert gpus.slowdown() == 1.0
    assert SimulatedGpus("n", 1).nics() == (NicSample(name="ib0", link_up=True, speed_gbps=400.0),)
    assert SimulatedGpus("n", 1, nics=0).nics() == ()


def test_throttle_reasons() -> None:
    gpus = SimulatedGpus("n", 5, faults="0:throttle; 1:throttle=thermal; 2:throttle=power; 3:thermal=97")
    s = gpus.sample()
    reasons = [(g.throttle_thermal, g.throttle_power_brake, g.throttle_hw_slowdown) for g in s]
    assert reasons == [
        (False, False, True),
        (True, False, False),
        (False, True, False),
        (True, False, False),  # that hot, the GPU slows itself down
        (False, False, False),
    ]
    assert [g.throttled for g in s] == [True, True, True, True, False]  # old readers: any reason
    gpus.inject_throttle(4, reason="power")
    assert gpus.sample()[4].throttle_power_brake
    gpus.inject_throttle(4, False)
    assert not gpus.sample()[4].throttled
    assert not SimulatedGpus("n", 1, faults="0:thermal=85").sample()[0].throttled


def test_corrected_ecc_and_nvlink_storms_grow_per_sample_and_stop_when_cleared() -> None:
    gpus = SimulatedGpus("n", 3, faults="1:ecc_corrected=50; *:nvlink=2")
    seen = [gpus.sample() for _ in range(3)]
    assert [s[1].ecc_corrected for s in seen] == [50, 100, 150]
    assert [s[0].ecc_corrected for s in seen] == [0, 0, 0]
    assert [s[2].nvlink_errors for s in seen] == [2, 4, 6]
    assert all(s[1].ecc_uncorrectable == 0 for s in seen)  # corrected errors are not uncorrectable
    gpus.clear_faults()
    after = [gpus.sample() for _ in range(2)]
    assert [s[1].ecc_corrected for s in after] == [150, 150]  # cumulative: stops growing, never drops
    gpus.inject_ecc_corrected(0, 7)
    gpus.inject_nvlink(0, 1)
    s = gpus.sample()[0]
    assert (s.ecc_corrected, s.nvlink_errors) == (7, 7)


def test_nic_down_speed_and_errors() -> None:
    gpus = SimulatedGpus("n", 1, nics=2, faults="ib0:down; ib1:speed=200; ib1:errors=5")
    first, second = gpus.nics(), gpus.nics()
    assert [(n.name, n.link_up, n.speed_gbps) for n in first] == [("ib0", False, 0.0), ("ib1", True, 200.0)]
    assert [n.errors for n in first] == [0, 5] and [n.errors for n in second] == [0, 10]
    gpus.clear_faults()
    assert [(n.link_up, n.speed_gbps, n.errors) for n in gpus.nics()] == [(True, 400.0, 0), (True, 400.0, 10)]
    gpus.inject_nic("nic*", "down")
    assert not any(n.link_up for n in gpus.nics())
    with pytest.raises(IndexError):
        gpus.inject_nic("ib7", "down")


def test_a_flapping_nic_follows_the_sample_count() -> None:
    # One NIC sample per second (the default interval): flap=4 -> down 2 samples, up 2, down 2...
    gpus = SimulatedGpus("n", 0, faults="ib0:flap=4")
    seen = [gpus.nics()[0] for _ in range(8)]
    assert [n.link_up for n in seen] == [False, False, True, True] * 2
    assert [n.link_downed for n in seen] == [1, 1, 1, 1, 2, 2, 2, 2]  # the port counts each time it went down
    # Same spec, same calls: same answers (no clock involved).
    again = SimulatedGpus("n", 0, faults="ib0:flap=4")
    assert [again.nics()[0].link_up for _ in range(8)] == [False, False, True, True] * 2
    fast = SimulatedGpus("n", 0, faults="ib0:flap=2", sample_interval_s=0.5)
    assert [fast.nics()[0].link_up for _ in range(8)] == [False, False, True, True] * 2


def test_a_flapping_nic_follows_a_clock_passed_in() -> None:
    now = [100.0]
    gpus = SimulatedGpus("n", 0, faults="ib0:flap=10", clock=lambda: now[0])
    states = []
    for t in (0.0, 4.9, 5.0, 9.9, 10.0, 15.0):
        now[0] = 100.0 + t
        states.append(gpus.nics()[0].link_up)
    assert states == [False, False, True, True, False, True]


def test_node_slowdown() -> None:
    gpus = SimulatedGpus("n", 1, faults="node:slow=3")
    assert gpus.slowdown() == 3.0
    gpus.inject_slowdown(1.0)
    assert gpus.slowdown() == 1.0
    gpus.inject_slowdown(2.5)
    assert gpus.slowdown() == 2.5
    gpus.clear_faults()
    assert gpus.slowdown() == 1.0
    assert SimulatedGpus("n", 1, faults="node:slow").slowdown() == 2.0


def test_node_and_nic_faults_from_a_file_follow_its_contents(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    gpus = SimulatedGpus("n", 2, fault_file=faults)
    assert gpus.slowdown() == 1.0
    faults.write_text("node:slow=4\nib0:speed=100\n0:ecc_corrected=3\nib9:down  # not on this node\n")
    assert gpus.slowdown() == 4.0
    assert gpus.nics()[0].speed_gbps == 100.0
    assert gpus.sample()[0].ecc_corrected == 3
    faults.write_text("")
    assert gpus.slowdown() == 1.0
    assert gpus.nics()[0].speed_gbps == 400.0
    assert gpus.sample()[0].ecc_corrected == 3


def test_parse_new_kinds_and_their_errors() -> None:
    parsed = parse_fault_spec(
        "node:slow=3, ib0:flap=2; nic*:errors; 2:throttle=power, *:throttle=0, 1:nvlink"
    )
    assert [(f.index, f.kind, f.value, f.nic) for f in parsed] == [
        (None, "slow", 3.0, None),
        (None, "flap", 2.0, "ib0"),
        (None, "errors", 10.0, "nic*"),
        (2, "throttle_power", 1.0, None),
        (None, "throttle", 0.0, None),
        (1, "nvlink", 10.0, None),
    ]
    for bad in (
        "node:slow=0.5",
        "node:xid",
        "ib0:thermal",
        "ib0:speed=-1",
        "0:throttle=melt",
        "0:down",
        "n:slow",
    ):
        with pytest.raises(ValueError):
            parse_fault_spec(bad)
