"""Heartbeats into detection's inputs: ``NodeSample`` (GPU and NIC signals) and ``RankStep`` reports. Pure.

The agent's wire format (``rallypoint.protocol``) and detection's inputs (``detection``) are kept apart on
purpose: the protocol must stay decodable across agent versions, detection only wants the numbers it
judges. This is the one place that maps the one onto the other.
"""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.protocol import GpuSample, Heartbeat, NicSample

from .detection import GpuSignals, NicSignals, NodeSample
from .stragglers import RankStep

__all__ = ["gpu_signals", "nic_signals", "node_sample", "rank_steps"]


def gpu_signals(gpu: GpuSample) -> GpuSignals:
    """One GPU's signals. An agent that predates the throttle reasons sends only ``throttled``: it counts
    as HW slowdown (a reason detection judges), so an old agent's throttling is not lost."""
    reasons = (gpu.throttle_thermal, gpu.throttle_power_brake, gpu.throttle_hw_slowdown)
    unexplained = gpu.throttled and not any(reasons)
    return GpuSignals(
        index=gpu.index,
        temperature_c=gpu.temperature_c,
        throttle_thermal=gpu.throttle_thermal,
        throttle_power_brake=gpu.throttle_power_brake,
        throttle_hw_slowdown=gpu.throttle_hw_slowdown or unexplained,
        ecc_corrected=gpu.ecc_corrected,
        ecc_uncorrectable=gpu.ecc_uncorrectable,
        xid=gpu.xid,
        nvlink_errors=gpu.nvlink_errors,
    )


def nic_signals(nic: NicSample, expected_speed_gbps: float | None = None) -> NicSignals:
    return NicSignals(
        name=nic.name,
        link_up=nic.link_up,
        speed_gbps=nic.speed_gbps,
        expected_speed_gbps=expected_speed_gbps,
        errors=nic.errors,
        link_downed=nic.link_downed,
    )


def node_sample(beat: Heartbeat, expected_nic_speed_gbps: Mapping[str, float] | None = None) -> NodeSample:
    """The heartbeat's GPU and NIC signals, stamped with the heartbeat's ``at``.

    ``expected_nic_speed_gbps``: what each port should negotiate (from inventory), by port name; a port
    not in it has no expected speed, so its speed is not judged.
    """
    expected = expected_nic_speed_gbps or {}
    return NodeSample(
        node_id=beat.node_id,
        at=beat.at,
        gpus=tuple(gpu_signals(g) for g in beat.gpus),
        nics=tuple(nic_signals(n, expected.get(n.name)) for n in beat.nics),
    )


def rank_steps(beat: Heartbeat) -> list[RankStep]:
    """The step-time report of every rank in the heartbeat that has one, stamped with the report's own
    time (``progress_at``), not the heartbeat's.

    The agent repeats a rank's latest report in every heartbeat until a newer one comes, so consecutive
    heartbeats carry the same report: a caller keeping a window dedupes on (job, node, rank, at), or a
    rank that reports rarely would weigh more in its median than the reports it made.
    """
    return [
        RankStep(
            job_id=r.job_id,
            node_id=beat.node_id,
            rank=r.rank,
            at=r.progress_at,
            step_time_s=r.step_time_s,
        )
        for r in beat.ranks
        if r.exit_code is None and r.step_time_s is not None and r.progress_at is not None
    ]
