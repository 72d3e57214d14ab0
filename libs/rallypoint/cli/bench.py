"""`rally bench scheduler` (the pure core, synthetic 100k-GPU cluster), `eventlog`, `recovery`, `cluster`,
`dryrun` (dry runs of a submission on the API), `partitions` (a killed job controller's handover)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rallypoint.cli.output import add_output_args, wants_json
from rallypoint.cli.serve import colocated_services


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmarks")
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH")
    sub.required = True
    s = sub.add_parser("scheduler", help="time full scheduling cycles on a synthetic cluster")
    s.add_argument("--nodes", type=int, default=12500)
    s.add_argument("--gpus-per-node", type=int, default=8)
    s.add_argument("--pending", type=int, default=5000)
    s.add_argument("--cycles", type=int, default=20)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--policy", default="rallypoint")
    add_output_args(s)
    s.set_defaults(func=handle_scheduler)
    e = sub.add_parser("eventlog", help="append and replay rates on a real embedded NATS server")
    e.add_argument("--events", type=int, default=5000, help="events per phase (default 5000)")
    add_output_args(e)
    e.set_defaults(func=handle_eventlog)
    d = sub.add_parser("dryrun", help="latency of dry runs (POST /v1/jobs?dry_run=true) on a large fold")
    dryrun_arguments(d)
    add_output_args(d)
    d.set_defaults(func=handle_dryrun)
    b = sub.add_parser("binds", help="binds/s written by the live scheduler loop on a real NATS server")
    b.add_argument("--nodes", type=int, default=12500)
    b.add_argument("--gpus-per-node", type=int, default=8)
    b.add_argument("--pending", type=int, default=20000, help="one-node gangs, alternately 1 and 8 GPUs")
    b.add_argument(
        "--admit-in-cycle",
        action="store_true",
        help="leave the jobs unadmitted: the cycles admit them (a bind admits; JobQueued if one waits)",
    )
    add_output_args(b)
    b.set_defaults(func=handle_binds)
    r = sub.add_parser("recovery", help="node failure -> all ranks running again, on a local cluster")
    r.add_argument("--trials", type=int, default=10, help="hung-node trials (default 10)")
    add_output_args(r)
    r.set_defaults(func=handle_recovery)
    pt = sub.add_parser("partitions", help="handover of a killed job controller's partitions, real NATS")
    pt.add_argument("--replicas", type=int, default=3, help="job controllers sharing the partitions")
    pt.add_argument("--kills", type=int, default=20, help="owners killed, one at a time (default 20)")
    pt.add_argument("--ttl", type=float, default=None, help="presence and lease TTL, seconds (default 1.2)")
    add_output_args(pt)
    pt.set_defaults(func=handle_partitions)
    c = sub.add_parser("cluster", help="the live services against N simulated nodes (fleet processes)")
    c.add_argument("--nodes", type=int, default=12500)
    c.add_argument("--gpus-per-node", type=int, default=8)
    c.add_argument("--jobs", type=int, default=1000, help="HTTP submissions (and raw publishes) to time")
    c.add_argument(
        "--burst",
        type=int,
        default=2500,
        help="jobs in the burst of submissions (at most a quarter of the GPUs)",
    )
    c.add_argument(
        "--burst-gpus", type=int, default=None, help="GPUs of each burst job (default: a whole node)"
    )
    c.add_argument(
        "--capacity",
        type=int,
        default=2500,
        help="one-node gangs in the burst of capacity (at most nodes/4; 0: skip)",
    )
    c.add_argument("--silence", type=int, default=2500, help="nodes silenced at once (at most nodes/5)")
    c.add_argument("--fleets", type=int, default=4, help="processes serving the simulated nodes")
    c.add_argument(
        "--heartbeat-interval",
        type=float,
        default=5.0,
        help="seconds (default 5: the seed's 2,500/s at 12,500 nodes; the monitor's thresholds follow)",
    )
    c.add_argument("--zombie-jobs", type=int, default=500, help="short real jobs on 2 real agents (0: skip)")
    c.add_argument(
        "--job-seconds",
        type=float,
        default=5.0,
        help="how long each job of the two bursts runs (the phases wait for them to complete)",
    )
    c.add_argument("--phase-timeout", type=float, default=120.0, help="seconds each phase may wait")
    c.add_argument("--logs", type=Path, default=None, help="keep every process's log in this folder")
    c.add_argument(
        "--replicas",
        type=_replica_counts,
        default={},
        metavar="SERVICE=N,...",
        help="replicas per service, as `rally up --replicas`; each partitioned service with two or more "
        "has its busiest replica killed at the end (handovers)",
    )
    c.add_argument("--nats-servers", type=int, choices=(1, 3), default=1, help="a JetStream cluster of 3")
    c.add_argument(
        "--colocate",
        type=colocated_services,
        default=(),
        metavar="SERVICE,...",
        help="host these services together over one fold, as `rally up --colocate`",
    )
    add_output_args(c)
    c.set_defaults(func=handle_cluster)


def dryrun_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=12500, help="nodes of 8 GPUs (default 12500)")
    parser.add_argument("--pending", type=int, default=10000, help="waiting jobs (default 10000)")
    parser.add_argument("--runs", type=int, default=100, help="dry runs timed (default 100)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--predictor-budget",
        type=float,
        default=None,
        help="seconds the predictor may take per dry run (default: the service's, 1.5)",
    )
    parser.add_argument(
        "--exact-budget",
        type=float,
        default=None,
        help="seconds of it a dry run's own run forward may take before the forecast answers, once a "
        "refresh made one (default: the service's, 0.5)",
    )


def handle_dryrun(args: argparse.Namespace) -> int:
    from rallypoint.bench.dryrunbench import check, run

    if (error := check(args)) is not None:
        print(error, file=sys.stderr)
        return 2
    res = run(args)
    print(json.dumps(res, sort_keys=True) if wants_json(args) else json.dumps(res, indent=2, sort_keys=True))
    return 0


def _replica_counts(text: str) -> dict[str, int]:
    from rallypoint.cli.cluster_cmds import _replicas

    return _replicas(text)


def handle_cluster(args: argparse.Namespace) -> int:
    from rallypoint.bench.clusterbench import BenchConfig, run_bench

    if args.nodes < 4 or args.jobs < 1 or args.fleets < 1:
        print("error: --nodes must be at least 4, --jobs and --fleets at least 1", file=sys.stderr)
        return 2
    burst_gpus = args.gpus_per_node if args.burst_gpus is None else args.burst_gpus
    if not 0 < burst_gpus <= args.gpus_per_node or args.capacity < 0:
        print("error: --burst-gpus must be 1..--gpus-per-node, --capacity at least 0", file=sys.stderr)
        return 2
    if not args.job_seconds > 0:
        print("error: --job-seconds must be more than 0", file=sys.stderr)
        return 2
    cfg = BenchConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        jobs=args.jobs,
        burst=args.burst,
        burst_gpus=burst_gpus,
        capacity=args.capacity,
        silence=args.silence,
        fleets=args.fleets,
        heartbeat_interval_s=args.heartbeat_interval,
        zombie_jobs=args.zombie_jobs,
        job_seconds=args.job_seconds,
        phase_timeout_s=args.phase_timeout,
        logs=args.logs,
        replicas=tuple(sorted(args.replicas.items())),
        nats_servers=args.nats_servers,
        colocate=args.colocate,
    )
    res = run_bench(cfg)
    print(json.dumps(res, sort_keys=True) if wants_json(args) else json.dumps(res, indent=2, sort_keys=True))
    return 0


def handle_recovery(args: argparse.Namespace) -> int:
    from rallypoint.bench.ckptbench import bench_blocking
    from rallypoint.bench.recoverybench import run_bench

    if args.trials < 1:
        print("error: --trials: must be at least 1", file=sys.stderr)
        return 2
    res = {"node_failure": run_bench(args.trials), "checkpoint_save": bench_blocking()}
    print(json.dumps(res, sort_keys=True) if wants_json(args) else json.dumps(res, indent=2, sort_keys=True))
    return 0


def handle_partitions(args: argparse.Namespace) -> int:
    from rallypoint.bench.partitionsbench import run_bench
    from rallypoint.eventlog.setup import PARTITION_TTL_S

    if args.replicas < 2 or args.kills < 1:
        print("error: --replicas must be at least 2 and --kills at least 1", file=sys.stderr)
        return 2
    res = run_bench(args.replicas, args.kills, PARTITION_TTL_S if args.ttl is None else args.ttl)
    print(json.dumps(res, sort_keys=True) if wants_json(args) else json.dumps(res, indent=2, sort_keys=True))
    return 0


def handle_binds(args: argparse.Namespace) -> int:
    # The loop under test is the scheduler service's own (rallypoint_services), which the bench imports.
    from rallypoint.bench.bindsbench import run_bench

    if min(args.nodes, args.gpus_per_node, args.pending) < 1:
        print("error: --nodes, --gpus-per-node and --pending must be at least 1", file=sys.stderr)
        return 2
    res = run_bench(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        pending=args.pending,
        admit_in_cycle=args.admit_in_cycle,
    )
    print(
        json.dumps(res, sort_keys=True)
        if wants_json(args)
        else "\n".join(f"{k:20} {v}" for k, v in res.items())
    )
    return 0


def handle_eventlog(args: argparse.Namespace) -> int:
    from rallypoint.bench.eventlogbench import run_bench

    if args.events < 1:
        print("error: --events: must be at least 1", file=sys.stderr)
        return 2
    res = run_bench(args.events)
    print(
        json.dumps(res, sort_keys=True)
        if wants_json(args)
        else "\n".join(f"{k:28} {v}" for k, v in res.items())
    )
    return 0


def handle_scheduler(args: argparse.Namespace) -> int:
    from rallypoint.bench.corebench import run_bench

    res = run_bench(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        pending=args.pending,
        seed=args.seed,
        cycles=args.cycles,
        policy=args.policy,
    )
    if wants_json(args):
        print(json.dumps(res, sort_keys=True))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    return 0
