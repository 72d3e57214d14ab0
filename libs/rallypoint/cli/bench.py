"""`rally bench scheduler` (the pure core on a synthetic 100k-GPU cluster) and `rally bench eventlog`."""

from __future__ import annotations

import argparse
import json
import sys


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
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=handle_scheduler)
    e = sub.add_parser("eventlog", help="append and replay rates on a real embedded NATS server")
    e.add_argument("--events", type=int, default=5000, help="events per phase (default 5000)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=handle_eventlog)
    r = sub.add_parser("recovery", help="node failure -> all ranks running again, on a local cluster")
    r.add_argument("--trials", type=int, default=10, help="hung-node trials (default 10)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=handle_recovery)


def handle_recovery(args: argparse.Namespace) -> int:
    from rallypoint.ckpt.bench import bench_blocking
    from rallypoint.localcluster.recoverybench import run_bench

    if args.trials < 1:
        print("error: --trials: must be at least 1", file=sys.stderr)
        return 2
    res = {"node_failure": run_bench(args.trials), "checkpoint_save": bench_blocking()}
    print(json.dumps(res, sort_keys=True) if args.json else json.dumps(res, indent=2, sort_keys=True))
    return 0


def handle_eventlog(args: argparse.Namespace) -> int:
    from rallypoint.eventlog.bench import run_bench

    if args.events < 1:
        print("error: --events: must be at least 1", file=sys.stderr)
        return 2
    res = run_bench(args.events)
    print(json.dumps(res, sort_keys=True) if args.json else "\n".join(f"{k:28} {v}" for k, v in res.items()))
    return 0


def handle_scheduler(args: argparse.Namespace) -> int:
    from rallypoint.core.bench import run_bench

    res = run_bench(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        pending=args.pending,
        seed=args.seed,
        cycles=args.cycles,
        policy=args.policy,
    )
    if args.json:
        print(json.dumps(res, sort_keys=True))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    return 0
