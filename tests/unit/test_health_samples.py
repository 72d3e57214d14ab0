"""Heartbeats into detection's inputs (health/samples.py), and those inputs judged by detect()."""

from __future__ import annotations

from rallypoint.health.detection import DEGRADED, FAILED, GpuSignals, NicSignals, detect
from rallypoint.health.samples import node_sample, rank_steps
from rallypoint.health.stragglers import RankStep
from rallypoint.protocol import GpuSample, Heartbeat, NicSample, RankStatus


def _gpu(index: int, **kw: object) -> GpuSample:
    return GpuSample(index=index, temperature_c=40.0, utilization=90.0, memory_used_mib=100, **kw)  # type: ignore[arg-type]


def test_node_sample_maps_every_signal() -> None:
    beat = Heartbeat(
        node_id="n7",
        agent_instance="a",
        at=123.5,
        gpus=(
            _gpu(0, throttled=True, throttle_thermal=True, ecc_corrected=12, nvlink_errors=3),
            _gpu(1, ecc_uncorrectable=2, xid=79, throttled=True, throttle_power_brake=True),
        ),
        nics=(
            NicSample(name="mlx5_0/1", link_up=True, speed_gbps=200.0, errors=9),
            NicSample(name="eth0", link_up=False, speed_gbps=0.0),
        ),
    )
    sample = node_sample(beat, {"mlx5_0/1": 400.0})
    assert (sample.node_id, sample.at) == ("n7", 123.5)
    assert sample.gpus == (
        GpuSignals(index=0, temperature_c=40.0, throttle_thermal=True, ecc_corrected=12, nvlink_errors=3),
        GpuSignals(index=1, temperature_c=40.0, throttle_power_brake=True, ecc_uncorrectable=2, xid=79),
    )
    assert sample.nics == (
        NicSignals(name="mlx5_0/1", link_up=True, speed_gbps=200.0, expected_speed_gbps=400.0, errors=9),
        NicSignals(name="eth0", link_up=False, speed_gbps=0.0, expected_speed_gbps=None),
    )
    assert node_sample(beat).nics[0].expected_speed_gbps is None


def test_an_old_agents_throttled_flag_still_counts() -> None:
    old = Heartbeat(node_id="n", agent_instance="a", at=1.0, gpus=(_gpu(0, throttled=True), _gpu(1)))
    gpus = node_sample(old).gpus
    assert gpus[0].throttle_hw_slowdown and not gpus[0].throttle_thermal
    assert not (gpus[1].throttle_hw_slowdown or gpus[1].throttle_thermal or gpus[1].throttle_power_brake)


def test_rank_steps_take_reported_ranks_only_stamped_with_their_report_time() -> None:
    beat = Heartbeat(
        node_id="n3",
        agent_instance="a",
        at=50.0,
        ranks=(
            RankStatus(job_id="j", attempt=1, rank=0, pid=10, step=40, step_time_s=0.5, progress_at=49.2),
            RankStatus(job_id="j", attempt=1, rank=1, pid=11),  # has reported nothing yet
            RankStatus(job_id="k", attempt=0, rank=4, pid=12, step=2, step_time_s=2.0, progress_at=48.0),
        ),
    )
    assert rank_steps(beat) == [
        RankStep(job_id="j", node_id="n3", rank=0, at=49.2, step_time_s=0.5),
        RankStep(job_id="k", node_id="n3", rank=4, at=48.0, step_time_s=2.0),
    ]
    assert rank_steps(Heartbeat(node_id="n", agent_instance="a", at=0.0)) == []


def _beat(at: float, gpu: GpuSample, nic: NicSample) -> Heartbeat:
    return Heartbeat(node_id="n1", agent_instance="a", at=at, gpus=(gpu,), nics=(nic,))


def test_converted_heartbeats_drive_detection() -> None:
    """End to end on the pure side: a corrected-ECC storm and a trained-down port, as the agent reports
    them, degrade the node; an uncorrectable error fails it."""
    beats = [
        _beat(t, _gpu(0, ecc_corrected=20 * t), NicSample(name="ib0", speed_gbps=200.0)) for t in range(0, 61)
    ]
    samples = [node_sample(b, {"ib0": 400.0}) for b in beats]
    verdict = detect({}, samples, [], now=60.0)
    (node,) = verdict.nodes
    assert node.state == DEGRADED
    assert {e.signal for e in node.evidence} == {"ecc_corrected", "nic_speed"}
    hard = node_sample(_beat(61.0, _gpu(0, ecc_uncorrectable=1), NicSample(name="ib0", speed_gbps=400.0)))
    assert detect({"n1": node}, [*samples, hard], [], now=61.0).nodes[0].state == FAILED
