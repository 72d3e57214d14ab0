"""What the health monitor's signal judge costs: ``python -m rallypoint.bench.healthbench --nodes 12500``.

Prints JSON: microseconds per heartbeat to decode it and hand it to ``HealthJudge.heard`` (clean beats
of 8-GPU nodes, as the fleet of ``rally bench cluster`` sends them, and the same with a watched share of
nodes whose counters move), and milliseconds per ``judge`` pass over the whole fold. No NATS, no clock
but the benchmark's own.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import msgspec

from rallypoint.events import GpuInfo, NodeRegistered
from rallypoint.health.detection import DetectionPolicy
from rallypoint.health.judge import HealthJudge
from rallypoint.protocol import GpuSample, Heartbeat
from rallypoint.state import ClusterState


def _fold(nodes: int, gpus: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        infos = tuple(
            GpuInfo(index=g, uuid=f"n{i}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(gpus)
        )
        event = NodeRegistered(
            node_id=f"n{i}", address="h", rack="r", gpu_type="sim", gpus=infos, cpu_milli=1, memory_mib=1,
            agent_instance="a", at=1.0,
        )  # fmt: skip
        state.apply(i + 1, event)
    return state


def _beats(nodes: int, gpus: int, at: float, storming: int) -> list[bytes]:
    """Encoded heartbeats; the first ``storming`` nodes' corrected-ECC counters grow each beat."""
    encode = msgspec.json.Encoder().encode
    out = []
    for i in range(nodes):
        ecc = int(at) if i < storming else 0
        samples = tuple(
            GpuSample(
                index=g, temperature_c=70.0, utilization=95.0, memory_used_mib=60_000, ecc_corrected=ecc
            )
            for g in range(gpus)
        )
        out.append(encode(Heartbeat(node_id=f"n{i}", agent_instance="a", at=at, gpus=samples)))
    return out


def run(nodes: int, gpus: int, watched: int, rounds: int) -> dict[str, float]:
    state = _fold(nodes, gpus)
    judge = HealthJudge(DetectionPolicy())
    decode = msgspec.json.Decoder(Heartbeat).decode
    heard_s = judge_s = 0.0
    for r in range(rounds):
        beats = _beats(nodes, gpus, 100.0 + r, watched)
        started = time.perf_counter()
        for beat in beats:
            judge.heard(decode(beat))
        heard_s += time.perf_counter() - started
        started = time.perf_counter()
        judge.judge(state.nodes, 100.0 + r)
        judge_s += time.perf_counter() - started
    return {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "watched_nodes": watched,
        "rounds": rounds,
        "heard_us_per_beat": round(1e6 * heard_s / (rounds * nodes), 2),
        "judge_ms_per_pass": round(1e3 * judge_s / rounds, 2),
        "core_share_at_2500_beats_per_s": round(2500 * heard_s / (rounds * nodes), 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rallypoint.bench.healthbench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--watched", type=int, default=100, help="nodes whose counters move (judged)")
    parser.add_argument("--rounds", type=int, default=5, help="heartbeats per node")
    args = parser.parse_args(argv)
    quiet = run(args.nodes, args.gpus_per_node, 0, args.rounds)
    busy = run(args.nodes, args.gpus_per_node, args.watched, args.rounds)
    print(json.dumps({"clean": quiet, "with_watched": busy}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
