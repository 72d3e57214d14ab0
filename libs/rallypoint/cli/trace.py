"""``rally trace convert``: public traces -> canonical workload, cluster and queue files."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import yaml

from rallypoint.cli.output import add_output_args, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("trace", help="convert public GPU-cluster traces")
    sub = p.add_subparsers(dest="trace_cmd", required=True)
    c = sub.add_parser("convert", help="convert a trace into workload.jsonl, cluster.yaml, queues.yaml")
    c.add_argument("source", choices=["philly", "openb", "golden"])
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--traces", help="traces directory (default: ../shared/traces beside the checkout)")
    c.add_argument("--jobs", help="philly: job list CSV (default philly/philly_open.csv)")
    c.add_argument("--vc-sizes", help="philly: VC sizes CSV (default philly/philly_vc.csv)")
    c.add_argument("--start", default="2017-10-02", help="philly: window start, YYYY-MM-DD[ HH:MM:SS]")
    c.add_argument("--days", type=float, default=7.0, help="philly: window length in days")
    c.add_argument("--vc", action="append", help="philly: keep only this VC (repeatable)")
    c.add_argument("--load", type=float, help="target offered load (GPU-hours submitted / GPU-hours)")
    c.add_argument(
        "--mode",
        choices=["scale-cluster", "compress"],
        default="scale-cluster",
        help="how to reach --load: size the cluster, or compress arrivals on a fixed cluster",
    )
    c.add_argument("--gpus", type=int, help="cluster GPUs (philly compress mode / golden: 64 or 32)")
    c.add_argument("--nodes-per-rack", type=int, default=8)
    c.add_argument(
        "--priority-mix",
        default="training-high=0.1,training-standard=0.6,best-effort=0.3",
        help="philly: class=weight list drawn per job (seeded); 'none' for no classes",
    )
    c.add_argument(
        "--time-limits",
        choices=["none", "exact", "ladder"],
        default="ladder",
        help="philly: runtime estimates (ladder: rounded up to a Slurm-like wall time)",
    )
    c.add_argument(
        "--checkpoint-interval", type=float, default=1800.0, help="seconds between checkpoints (0: none)"
    )
    c.add_argument(
        "--nodes", help="openb: node list CSV (default alibaba-openb/openb_node_list_gpu_node.csv)"
    )
    c.add_argument("--pods", help="openb: pod list CSV (default alibaba-openb/openb_pod_list_default.csv)")
    c.add_argument(
        "--with-shares",
        action="store_true",
        help="openb: also the pods that ask for a fraction of one GPU (gpu_milli), and every pod's CPU and "
        "memory (docs/sharing.md); default whole-GPU pods only",
    )
    c.add_argument("--seed", type=int, default=0)
    add_output_args(c)
    c.set_defaults(func=handle_convert)


def _err(msg: str) -> int:
    print(f"rally trace: error: {msg}", file=sys.stderr)
    return 2


def handle_convert(args: argparse.Namespace) -> int:
    from rallypoint.traces import convert as cv
    from rallypoint.traces.golden import golden_cluster, golden_jobs

    traces = Path(args.traces) if args.traces else cv.default_traces_dir()
    out = Path(args.out)
    ckpt = args.checkpoint_interval or None
    try:
        if args.source == "philly":
            start = datetime.fromisoformat(args.start)
            mix = None if args.priority_mix == "none" else cv.parse_mix(args.priority_mix)
            conv = cv.convert_philly(
                Path(args.jobs) if args.jobs else traces / "philly" / "philly_open.csv",
                Path(args.vc_sizes) if args.vc_sizes else traces / "philly" / "philly_vc.csv",
                start,
                args.days,
                vcs=args.vc,
                target_load=args.load,
                mode=args.mode,
                gpus=args.gpus,
                nodes_per_rack=args.nodes_per_rack,
                mix=mix,
                seed=args.seed,
                time_limits=args.time_limits,
                checkpoint_interval=ckpt,
            )
        elif args.source == "openb":
            conv = cv.convert_openb(
                Path(args.nodes) if args.nodes else traces / "alibaba-openb" / "openb_node_list_gpu_node.csv",
                Path(args.pods) if args.pods else traces / "alibaba-openb" / "openb_pod_list_default.csv",
                target_load=args.load,
                checkpoint_interval=ckpt,
                shares=args.with_shares,
            )
        else:
            gpus = args.gpus or 64
            if gpus % 8:
                return _err("--gpus must be a multiple of 8 for the golden slice")
            conv = cv.Converted(
                golden_jobs(traces), golden_cluster(gpus), None, {"source": "golden", "gpus": gpus}
            )
        paths = conv.write(out)
    except FileNotFoundError as e:
        return _err(f"{e.filename}: no such file (is ../shared/traces beside the checkout? see --traces)")
    except (ValueError, OSError) as e:
        return _err(str(e))
    report = {"wrote": {k: str(v) for k, v in paths.items()}, **conv.info}
    return emit(args, report, lambda r: yaml.safe_dump(r, sort_keys=False).rstrip("\n"))
