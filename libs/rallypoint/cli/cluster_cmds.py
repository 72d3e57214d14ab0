"""`rally up` (a local cluster in the foreground) and `rally demo` (the same, plus a batch of jobs)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import IO

from rallypoint.cli.client import TOKENS_FILE
from rallypoint.cli.clusterinfo import CLUSTER_FILE
from rallypoint.cli.resources import parse_gpu_indices
from rallypoint.cli.serve import colocated_services
from rallypoint.runtime.cohost import HOSTABLE


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _up(args: argparse.Namespace) -> int:
    from rallypoint.localcluster import LocalCluster
    from rallypoint.localcluster.folderlock import FolderBusy

    workdir = Path(args.data_dir)
    if args.nats_url and args.nats_servers > 1:
        print("error: --nats-servers starts embedded servers; it cannot go with --nats-url", file=sys.stderr)
        return 2
    try:
        locks = _lock_folders(workdir)
    except FolderBusy as busy:
        print(f"error: {busy}", file=sys.stderr)
        return 1
    cluster = LocalCluster(
        workdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        racks=args.racks,
        nats_url=args.nats_url,
        postgres_dsn=args.postgres_dsn,
        api_port=args.api_port,
        queues=_queue_file(args, workdir),
        allow_root_ranks=args.allow_root_ranks,
        mig_gpus=args.mig_gpus,
        replicas=args.replicas,
        nats_servers=args.nats_servers,
        colocate=args.colocate,
    )
    # Ctrl-C and SIGTERM both stop everything `rally up` started. SIGINT is installed explicitly too: a
    # process started in the background by a script inherits SIGINT as ignored, and Python then keeps it so.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    try:
        cluster.start()
        # Tokens first: whoever waits for the cluster file finds the tokens beside it.
        cluster.write_tokens(TOKENS_FILE)
        cluster.write_info(CLUSTER_FILE)
        print(f"rallypoint is up: {args.nodes} nodes x {args.gpus_per_node} GPUs in {cluster.racks} racks")
        print(f"  API   {cluster.api_url}   (rally jobs, rally submit --gpus 2 -- python train.py)")
        print(f"  web   {cluster.api_url}/?token=<a token from {TOKENS_FILE}>   (the dashboard)")
        print(f"  metrics  every service's /metrics: {CLUSTER_FILE} metrics_urls")
        count = len(cluster.nats_cluster)
        servers = f"   ({count} servers, stream and buckets R{count})" if count > 1 else ""
        print(f"  NATS  {_where_secret(cluster.nats_url, 'nats_url')}{servers}")
        if cluster.with_projector:
            print(f"  SQL   {_where_secret(cluster.postgres_dsn, 'postgres_dsn')}")
        print(f"  logs  {workdir.resolve() / 'logs'}")
        print(f"  ranks {_rank_identity(cluster.rank_user)}")
        teams = ", ".join(cluster.teams)
        print(f"  tokens {TOKENS_FILE} (admin; teams {teams}): `rally` here uses the admin one")
        if cluster.queues is not None:
            print(f"  queues {cluster.queues}   (rally queues shows nominal, borrowed, used per team)")
        print("Ctrl-C stops everything.")
        while True:
            # nats-server and PostgreSQL too: a dead one comes back on its port and data, never defunct
            for name in cluster.supervise():
                print(f"{name} exited; restarted it", file=sys.stderr)
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping...")
        return 0
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
        CLUSTER_FILE.unlink(missing_ok=True)
        TOKENS_FILE.unlink(missing_ok=True)
        for lock in locks:
            lock.close()


def _rank_identity(rank_user: str | None) -> str:
    """Which user the ranks run as, always said: loudly when it is ours (``--allow-root-ranks``)."""
    from rallypoint.agent.rankuser import own_user

    if rank_user is not None:
        return f"run as {rank_user}, each in a sandbox of its own (no cluster credential reaches them)"
    who = own_user().upper()
    return f"RUN AS {who}, THIS CLUSTER'S OWN USER (--allow-root-ranks): any job can read its credentials"


def _where_secret(url: str, key: str) -> str:
    """``url`` without its password, and where the whole of it is: the banner is often pasted or logged."""
    from rallypoint.eventlog.connection import without_password

    shown = without_password(url)
    if shown == url:
        return url
    return f"{shown}   (with its password: {CLUSTER_FILE} {key}, owner-only)"


def _queue_file(args: argparse.Namespace, workdir: Path) -> Path | None:
    """The file given with --queues; else the default one, sized for this cluster and written into the data
    folder (teams, a cohort, borrowing, an org); None with --no-queues (no quotas at all)."""
    if args.queues:
        return Path(args.queues)
    if args.no_queues:
        return None
    from rallypoint.localcluster.default_queues import write_default_queues

    return write_default_queues(workdir / "queues.yaml", args.nodes * args.gpus_per_node)


def _lock_folders(data_dir: Path) -> list[IO[str]]:
    """The folder of .rally/cluster.json and the data folder (its JetStream store), each for this
    process alone: a second `rally up` on either refuses before it changes anything."""
    from rallypoint.localcluster.folderlock import FolderBusy, lock_folder

    locks = [lock_folder(CLUSTER_FILE.parent)]
    try:
        if data_dir.resolve() != CLUSTER_FILE.parent.resolve():
            locks.append(lock_folder(data_dir))
    except FolderBusy:
        locks[0].close()
        raise
    return locks


def _demo(args: argparse.Namespace) -> int:
    from rallypoint.localcluster.demo import run_demo

    return run_demo(args.nodes, args.gpus_per_node, args.racks)


def _replicas(text: str) -> dict[str, int]:
    """``job-controller=2,...`` -> {service: count}; any service but the node agent may have several."""
    from rallypoint.localcluster.supervisor import REPLICATED

    counts: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        service, _, count = part.partition("=")
        if service not in REPLICATED or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(
                f"expected SERVICE=N with N >= 1 and SERVICE one of {', '.join(sorted(REPLICATED))}"
            )
        counts[service] = int(count)
    return counts


def _add_shape(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=_positive, default=4, help="simulated GPU nodes (default 4)")
    parser.add_argument("--gpus-per-node", type=_positive, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--racks", type=_positive, default=2, help="racks the nodes are spread over (default 2)"
    )


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="run a local cluster: NATS, PostgreSQL, every service, node agents")
    _add_shape(up)
    up.add_argument("--nats-url", default=None, help="use this NATS server instead of an embedded one")
    up.add_argument("--postgres-dsn", default=None, help="use this PostgreSQL instead of an embedded one")
    up.add_argument("--api-port", type=int, default=8080, help="HTTP port of the API (default 8080)")
    up.add_argument("--data-dir", default=".rally/local", help="where servers keep state and logs")
    up.add_argument(
        "--replicas",
        type=_replicas,
        default={},
        metavar="SERVICE=N,...",
        help="replicas of services (e.g. job-controller=2,health-monitor=2,scheduler=3; default one "
        "each and a scheduler standby); docs/deployment.md says what N of each buys",
    )
    up.add_argument(
        "--colocate",
        type=colocated_services,
        default=(),
        metavar="SERVICE,...",
        help=f"host these services together, one process per replica over one fold ({', '.join(HOSTABLE)}; "
        "e.g. job-controller,checkpoint,preemption,inventory); docs/deployment.md says when",
    )
    up.add_argument(
        "--nats-servers",
        type=int,
        choices=(1, 3, 5),
        default=1,
        help="embedded nats-servers: 1, or a JetStream cluster of 3 or 5 on loopback with the stream and "
        "buckets replicated on each (R3/R5): any one server may die (default 1)",
    )
    up.add_argument(
        "--mig-gpus",
        type=parse_gpu_indices,
        default=(),
        metavar="I,J",
        help="GPUs of every node in MIG mode, for `rally submit --mig` (e.g. 6,7; default none)",
    )
    queues = up.add_mutually_exclusive_group()
    queues.add_argument(
        "--queues",
        default=None,
        help="queue file for the scheduler and the API; its teams get tokens (default: DATA_DIR/queues.yaml, "
        "written for this cluster: four teams in one cohort, borrowing, an org with a limit)",
    )
    queues.add_argument("--no-queues", action="store_true", help="run without quotas (no queue file)")
    up.add_argument(
        "--allow-root-ranks",
        action="store_true",
        help="when ranks cannot run as an unprivileged user (RALLY_RANK_USER, default nobody), run them as "
        "this process's user instead of refusing to start: any job could then read the cluster's credentials",
    )
    up.set_defaults(func=_up)
    demo = subparsers.add_parser("demo", help="start a local cluster, run a mixed batch of jobs, summarize")
    _add_shape(demo)
    demo.set_defaults(func=_demo)
