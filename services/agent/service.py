"""`rally serve agent`: one node's agent: register, heartbeat, serve commands until SIGTERM/SIGINT.

Stopping the agent does not stop its ranks: they run on under their wrappers and the next agent on
this work dir adopts them (see ``rallypoint.agent.launcher``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
from functools import partial
from pathlib import Path

from rallypoint.agent.backend import GpuBackend
from rallypoint.agent.launcher import RankLauncher
from rallypoint.agent.node import AgentConfig, NodeAgent, new_instance_id
from rallypoint.agent.nvml_backend import NvmlGpus, NvmlUnavailable
from rallypoint.agent.rankuser import RankUserRefused, requested_rank_user, resolve_rank_user
from rallypoint.agent.reaper import orphans_come_to_us
from rallypoint.agent.sim_backend import DEFAULT_MEMORY_MIB, SimulatedGpus
from rallypoint.cli.resources import add_taint_arg, parse_gpu_indices, parse_label
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service

_log = logging.getLogger("rallypoint.agent")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(prog="rally serve agent", description="Rallypoint node agent.")
    add_common_args(parser)
    parser.add_argument(
        "--node-id",
        default=env.get("RALLY_NODE_ID", socket.gethostname().split(".")[0]),
        help="this node's id (env RALLY_NODE_ID; default the short host name)",
    )
    parser.add_argument("--rack", default=env.get("RALLY_RACK", "rack-0"), help="rack of this node")
    parser.add_argument("--spine", default=env.get("RALLY_SPINE", "spine-0"), help="spine of this node")
    parser.add_argument(
        "--address",
        default=env.get("RALLY_NODE_ADDRESS", "127.0.0.1"),
        help="address other nodes reach this one at (MASTER_ADDR when it hosts rank 0)",
    )
    parser.add_argument(
        "--backend",
        choices=["sim", "nvml"],
        default=env.get("RALLY_GPU_BACKEND", "sim"),
        help="GPU backend: simulated GPUs, or real ones through NVML",
    )
    parser.add_argument("--gpus", type=int, default=8, help="sim: number of GPUs")
    parser.add_argument("--nvlink-domain-size", type=int, default=8, help="sim: GPUs per NVLink domain")
    parser.add_argument(
        "--gpu-type",
        default=None,
        help="GPU type to register (sim default sim-h100; nvml default the device name)",
    )
    parser.add_argument("--gpu-memory-mib", type=int, default=DEFAULT_MEMORY_MIB, help="sim: memory per GPU")
    parser.add_argument(
        "--mig-gpus",
        type=parse_gpu_indices,
        default=(),
        metavar="I,J",
        help="sim: GPUs in MIG mode (they run MIG slices only; the type must be MIG-capable, e.g. sim-h100)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sim: seed of the sample noise")
    parser.add_argument(
        "--fault-file",
        default=env.get("RALLY_SIM_FAULT_FILE"),
        help="sim: file of injected faults, re-read when it changes (env RALLY_SIM_FAULT_FILE)",
    )
    parser.add_argument(
        "--work-dir",
        default=env.get("RALLY_AGENT_WORK_DIR"),
        help="where rank logs and exit records live (env RALLY_AGENT_WORK_DIR; "
        "default .rally/agent/<node-id>)",
    )
    parser.add_argument("--cpu-milli", type=int, default=None, help="CPU to register (default: this host's)")
    parser.add_argument(
        "--label",
        type=parse_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of this node, for jobs' node_selector (repeatable), e.g. zone=a",
    )
    add_taint_arg(parser, "a taint of this node")
    parser.add_argument("--memory-mib", type=int, default=None, help="RAM to register (default: this host's)")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds between heartbeats")
    parser.add_argument(
        "--run-as",
        default=requested_rank_user(),
        help="the unprivileged user ranks run as (env RALLY_RANK_USER; default nobody); needs a root agent",
    )
    parser.add_argument(
        "--rank-path",
        action="append",
        type=Path,
        default=[Path(p) for p in env.get("RALLY_RANK_PATHS", "").split(os.pathsep) if p],
        help="a folder every rank may reach besides its own, e.g. datasets or a scratch space; repeat it "
        f"(env RALLY_RANK_PATHS, {os.pathsep}-separated)",
    )
    parser.add_argument(
        "--allow-root-ranks",
        action="store_true",
        default=env.get("RALLY_ALLOW_ROOT_RANKS", "") == "1",
        help="when ranks cannot run as --run-as, run them as the agent's own user (root, or its user) "
        "instead of refusing to start; every job can then read this agent's credentials "
        "(env RALLY_ALLOW_ROOT_RANKS=1)",
    )
    return parser


def make_backend(args: argparse.Namespace) -> GpuBackend:
    if args.backend == "nvml":
        return NvmlGpus(gpu_type=args.gpu_type)
    return SimulatedGpus(
        args.node_id,
        args.gpus,
        gpu_type=args.gpu_type or "sim-h100",
        memory_mib=args.gpu_memory_mib,
        nvlink_domain_size=args.nvlink_domain_size,
        seed=args.seed,
        fault_file=args.fault_file,
        mig_gpus=args.mig_gpus,
    )


async def agent_main(ctx: ServiceContext, args: argparse.Namespace) -> int:
    try:
        backend = make_backend(args)
    except NvmlUnavailable as exc:
        _log.error("%s", exc)
        return 2
    ctx.stack.callback(backend.close)
    work_dir = Path(args.work_dir or Path(".rally") / "agent" / args.node_id)
    try:
        run_as = await asyncio.to_thread(
            partial(resolve_rank_user, args.run_as, work_dir, allow_own_user=args.allow_root_ranks)
        )
    except RankUserRefused as exc:
        _log.error("%s", exc)
        return 2
    # This process spawns nothing but rank wrappers, and in its container it is PID 1, the parent of
    # every orphan: reap those too (issue 15: defunct processes piling up under the agent). Only there (or
    # as a subreaper): elsewhere orphans never come to it, and the sweep reads every process's stat.
    launcher = await asyncio.to_thread(
        partial(
            RankLauncher,
            work_dir,
            reap_orphans=orphans_come_to_us(),
            run_as=run_as,
            shared_paths=args.rank_path,
            mig_device=backend.mig_device,
        )
    )
    # Waits for the NATS server if it is not up yet: a node agent may boot before it.
    log = await ctx.event_log()
    config = AgentConfig(
        node_id=args.node_id,
        rack=args.rack,
        spine=args.spine,
        address=args.address,
        cpu_milli=args.cpu_milli,
        memory_mib=args.memory_mib,
        labels=dict(args.label),
        taints=tuple(args.taint),
        heartbeat_interval_s=args.heartbeat_interval,
        instance=ctx.config.instance,
    )
    await NodeAgent(log, backend, launcher, config).run(ctx.stop)
    _log.info("agent %s stopping; its ranks keep running", args.node_id)
    return 0


def node_id_of(name: str) -> str:
    """Kubernetes node names carry dots (ip-10-0-0-1.ec2.internal); node ids become subject tokens."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:128]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.node_id = node_id_of(args.node_id)
    # The agent instance is fresh per process start (--instance, which a restarted pod keeps, is only a
    # prefix), so each registration of the node is its own event and the health monitor sees restarts.
    instance = f"{args.instance}-{new_instance_id()}" if args.instance else new_instance_id()
    config = ServiceConfig(
        service="agent",
        nats_url=args.nats_url,
        instance=instance,
        log_level=args.log_level,
        log_format=args.log_format,
        replicas=args.replicas,
        health_port=args.health_port,
    )
    return run_service(lambda ctx: agent_main(ctx, args), config)


if __name__ == "__main__":
    raise SystemExit(main())
