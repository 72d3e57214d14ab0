"""``rally sim``: replay a workload on a cluster with a policy of the real core; ``rally sim compare``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the simulator is imported by the handlers only (rally's parser stays light)
    from rallypoint.sim.engine import SimOptions


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim",
        help="trace-driven simulation with the real scheduling core",
        description="rally sim [compare|twin|predict] --workload FILE --cluster FILE [--queues FILE] "
        "--policy NAME[,..]; or rally sim --from-log LOG.jsonl [--queues FILE] [--policy NAME]: the "
        "recorded decisions reproduced, and the recorded arrivals replayed under other settings, compared "
        "per team with what happened",
    )
    p.add_argument(
        "mode",
        nargs="?",
        choices=["run", "compare", "twin", "predict", "packing"],
        default="run",
        help="run one policy (default), compare several (--policy a,b,c), check that the live scheduler "
        "decides byte for byte as the simulator at every instant (twin; exit 1 on a difference), or "
        "measure how well starts and runtimes are predicted at each job's submit (predict), or replay "
        "openb pods under FGD's packing protocol or with departures (packing: --nodes, --pods, --policy, "
        "--seeds, --mode fgd|replay; docs/packing.md, docs/packing-replay.md)",
    )
    p.add_argument("--nodes", help="packing: node list CSV (openb: sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument(
        "--pods", help="packing: pod list CSV (openb: cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec)"
    )
    p.add_argument("--seeds", default="42", help="packing: seeds, e.g. 42-51 or 42,43 (default 42)")
    p.add_argument(
        "--mode",
        dest="packing_mode",
        choices=["fgd", "replay"],
        default="fgd",
        help="packing: fgd (FGD's protocol, default) or replay (arrivals and departures at the recorded "
        "creation_time/deletion_time, a FIFO queue for pods that do not fit; one seed; "
        "docs/packing-replay.md)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="packing --mode replay: arrivals K times closer together, lifetimes unchanged (default 1)",
    )
    p.add_argument("--workload", help="JSON Lines workload (see docs/simulator.md)")
    p.add_argument("--cluster", help="cluster file, JSON or YAML")
    p.add_argument(
        "--from-log",
        metavar="LOG",
        help="a cluster's history (`rally replay --export` JSON Lines) instead of --workload/--cluster: "
        "reproduce its decisions and replay its arrivals under --policy / --queues (docs/prediction.md)",
    )
    p.add_argument("--queues", help="queue configuration, JSON or YAML (teams, quotas, priority classes)")
    p.add_argument(
        "--policy",
        help="fifo, easy-backfill, las, rallypoint (comma list for compare); --from-log: default the "
        "policy the log's leader recorded",
    )
    p.add_argument(
        "--json",
        dest="json_out",
        nargs="?",
        const="-",
        help="write the summary metrics to this file (predict: to stdout when no FILE is given)",
    )
    p.add_argument("--per-job", help="write one finished job per line (JSON Lines)")
    p.add_argument("--report", help="write an HTML report with PNG plots into this directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault generator (default 0)")
    p.add_argument(
        "--tick",
        type=float,
        default=None,
        help="re-run the core every TICK s while jobs wait (default: 0 for fifo/easy-backfill, 60)",
    )
    p.add_argument("--until", type=float, default=None, help="stop the clock at this trace time (s)")
    p.set_defaults(func=handle)


def _err(msg: str) -> int:
    print(f"rally sim: error: {msg}", file=sys.stderr)
    return 2


def _twin(args: argparse.Namespace, policies: list[str], opts: SimOptions) -> int:
    """``rally sim twin``: the workload through the simulator and the live fold + bridge (sim/twin.py);
    one line per policy, the first difference in full; ``--json``: every report."""
    from rallypoint.sim.engine import SimError
    from rallypoint.sim.run import InputError, clean, load_inputs, resolve_policy
    from rallypoint.sim.twin import run_twin

    reports = {}
    try:
        jobs, cluster, queues = load_inputs(args.workload, args.cluster, args.queues)
        for name in policies:
            resolve_policy(name)
            reports[name] = run_twin(jobs, cluster, name, queues, opts)
    except (InputError, SimError, ValueError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{e.filename or ''}: {e.strerror or e}")
    differ = False
    for name, r in reports.items():
        differ |= not r.identical
        print(
            f"{name}: {r.cycles} cycles, {r.binds} binds, {r.preemptions} preemptions, {r.resizes} resizes: "
            + ("identical" if r.identical else "DIFFERENT")
        )
        found = r.mismatches or r.input_mismatches
        if found:
            first = found[0]
            print(f"  first at cycle {first.cycle}, t={first.now}\n  sim  {first.sim}\n  live {first.live}")
    if args.json_out:
        import msgspec

        Path(args.json_out).write_text(json.dumps(clean(msgspec.to_builtins(reports)), indent=1) + "\n")
    return 1 if differ else 0


def _predict(args: argparse.Namespace, policies: list[str]) -> int:
    """``rally sim predict``: each job's start predicted at its submit against the replay's (see
    docs/prediction.md); one JSON object with ``--json`` (to stdout, or to FILE), else one line."""
    from rallypoint.predict import accuracy, predict_starts
    from rallypoint.sim.engine import SimError
    from rallypoint.sim.run import InputError, clean, load_inputs

    if len(policies) > 1:
        return _err("predict takes one policy")
    try:
        jobs, cluster, queues = load_inputs(args.workload, args.cluster, args.queues)
        figures = {"policy": policies[0], **accuracy(predict_starts(jobs, cluster, queues, policies[0]))}
    except (InputError, SimError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{e.filename or ''}: {e.strerror or e}")
    text = json.dumps(clean(figures), indent=1)
    if args.json_out == "-":
        print(text)
    elif args.json_out:
        Path(args.json_out).write_text(text + "\n")
    if args.json_out != "-":
        print(", ".join(f"{k} {_figure(v)}" for k, v in figures.items()))
    return 0


def _figure(v: object) -> str:
    """A share or a length to 3 decimals; '-' for a figure with no jobs to measure."""
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _from_log(args: argparse.Namespace) -> int:
    """``rally sim --from-log LOG``: one JSON object (``--json``) or a per-team table."""
    from rallypoint.cli.replay import load_history
    from rallypoint.scheduling.queues import QueuesError, load_queues
    from rallypoint.sim.engine import SimError
    from rallypoint.sim.fromlog import from_log
    from rallypoint.sim.run import resolve_policy

    if args.mode != "run" or args.workload or args.cluster:
        return _err("--from-log replaces --workload and --cluster, and runs alone (no compare/twin/predict)")
    try:
        if args.policy is not None:
            resolve_policy(args.policy)
        queues = load_queues(args.queues) if args.queues else None
        report = from_log(load_history(args.from_log), policy=args.policy, queues=queues)
    except (QueuesError, SimError, ValueError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{e.filename or ''}: {e.strerror or e}")
    if args.json_out:
        text = json.dumps(report, sort_keys=True)
        if args.json_out == "-":
            print(text)
        else:
            Path(args.json_out).write_text(text + "\n")
    if args.json_out != "-":
        print(_from_log_table(report))
    return 0 if report["decisions_identical"] else 1


def _from_log_table(report: dict[str, object]) -> str:
    lines = [
        f"reproduced {report['verified']}/{report['decisions']} recorded decisions "
        f"({'identical' if report['decisions_identical'] else 'NOT identical'}) under the recorded settings",
        f"what-if: {report['jobs']} jobs on {report['nodes']} nodes ({report['gpus']} GPUs) under "
        f"{report['policy']} (recorded: {report['recorded_policy']})",
        f"{'TEAM':<16}{'':<10}{'JOBS':>6}{'WAIT avg':>11}{'WAIT p90':>11}{'JCT avg':>11}"
        f"{'GPU-h':>10}{'PREEMPT':>9}",
    ]
    teams = report["teams"]
    assert isinstance(teams, dict)
    for team, sides in teams.items():
        for side in ("actual", "simulated"):
            f = sides.get(side) or {}
            lines.append(
                f"{team:<16}{side:<10}{f.get('jobs', 0):>6}{f.get('mean_wait_s', 0):>11.1f}"
                f"{f.get('p90_wait_s', 0):>11.1f}{f.get('mean_jct_s', 0):>11.1f}"
                f"{f.get('gpu_hours', 0):>10.3f}{f.get('preemptions', 0):>9}"
            )
    utilization = report["utilization"]
    assert isinstance(utilization, dict)
    lines.append(f"utilization: actual {utilization['actual']}, simulated {utilization['simulated']}")
    return "\n".join(lines)


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad --seeds {text!r}: use N, N-M or N,M,...")
        seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    if not seeds or len(seeds) > 1000:
        raise ValueError(f"bad --seeds {text!r}: 1 to 1000 seeds")
    return seeds


def _packing(args: argparse.Namespace) -> int:
    """``rally sim packing``: one JSON object (``--json``: to stdout, or to FILE), else one line."""
    if not args.nodes or not args.pods or not args.policy:
        return _err("packing needs --nodes, --pods and --policy")
    if args.workload or args.cluster or args.from_log:
        return _err("packing takes --nodes/--pods, not --workload/--cluster/--from-log")
    if args.speedup != 1.0 and args.packing_mode != "replay":
        return _err("--speedup is for --mode replay (FGD's protocol has no arrival times)")
    try:
        figures, line = (_packing_replay if args.packing_mode == "replay" else _packing_fgd)(args)
    except ValueError as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{e.filename or ''}: {e.strerror or e}")
    text = json.dumps(figures)
    if args.json_out == "-":
        print(text)
    elif args.json_out:
        Path(args.json_out).write_text(text + "\n")
    if args.json_out != "-":
        print(line)
    return 0


def _packing_fgd(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """FGD's protocol (docs/packing.md): the figures and the line printed without ``--json``."""
    from rallypoint.sim.packing import Cluster, read_nodes, read_pods, resolve, run_seed, summary

    policy = resolve(args.policy)
    seeds = _seeds(args.seeds)
    nodes, pods = read_nodes(args.nodes), read_pods(args.pods)
    runs = [run_seed(nodes, pods, policy, s) for s in seeds]
    figures = summary(policy, runs, len(nodes), Cluster(nodes).gpu_capacity // 1000)
    return figures, (
        f"{policy}: alloc at 100% arrived, median {figures['alloc_at_100_median']}% over seeds "
        f"{seeds[0]}..{seeds[-1]}; failed pods {figures['failed_pods']}; "
        f"decision p99 {figures['decision_ms_p99']} ms"
    )


def _packing_replay(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """``--mode replay``: arrivals and departures at the recorded times (docs/packing-replay.md)."""
    from rallypoint.sim.packing import read_nodes, resolve
    from rallypoint.sim.packing.replay import replay_summary, run_replay
    from rallypoint.sim.packing.timed import read_timed_pods

    policy = resolve(args.policy)
    seeds = _seeds(args.seeds)
    if len(seeds) > 1:
        raise ValueError("--mode replay takes one seed (it only drives Random's draws)")
    nodes, pods = read_nodes(args.nodes), read_timed_pods(args.pods)
    figures = replay_summary(run_replay(nodes, pods, policy, seeds[0], args.speedup))
    return figures, (
        f"{policy} (replay): time-averaged allocation {figures['time_avg_alloc']}%; wait s mean "
        f"{figures['wait_s_mean']}, p50 {figures['wait_s_p50']}, p95 {figures['wait_s_p95']}; placed "
        f"{figures['placed_pods']}, failed {figures['failed_pods']}; decision p99 "
        f"{figures['decision_ms_p99']} ms"
    )


def handle(args: argparse.Namespace) -> int:
    from rallypoint.sim.engine import SimError, SimOptions
    from rallypoint.sim.run import (
        InputError,
        compare_table,
        load_inputs,
        run_policy,
        top_class,
        write_outputs,
    )

    if args.mode == "packing":
        return _packing(args)
    if args.packing_mode != "fgd":
        return _err("--mode is for `rally sim packing`")
    if args.from_log:
        return _from_log(args)
    missing = [
        flag for flag, value in (("--workload", args.workload), ("--cluster", args.cluster)) if not value
    ]
    if missing or args.policy is None:
        return _err(f"{', '.join([*missing, *(['--policy'] if args.policy is None else [])])} required")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies:
        return _err("--policy is empty")
    if args.mode == "run" and len(policies) > 1:
        return _err("several policies given: use `rally sim compare`")
    if args.mode == "predict":
        return _predict(args, policies)
    if args.json_out == "-":
        return _err("--json needs a FILE (only predict prints its JSON to stdout)")
    opts = SimOptions(seed=args.seed, tick=args.tick, until=args.until)
    if args.mode == "twin":
        return _twin(args, policies, opts)
    try:
        jobs, cluster, queues = load_inputs(args.workload, args.cluster, args.queues)
        results = []
        for name in policies:
            res = run_policy(jobs, cluster, queues, name, opts)
            results.append(res)
            if args.mode == "run":
                write_outputs(res, queues, args.json_out, args.per_job, args.report)
            elif args.report:
                write_outputs(res, queues, report=Path(args.report) / name)
    except (InputError, SimError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"{e.filename or ''}: {e.strerror or e}")
    if args.mode == "run":
        s = results[0].summary
        print(
            f"{s['policy']}: {s['completed']}/{s['jobs']} jobs, avg JCT {s['jct']['avg']:.1f} s, "
            f"avg queue {s['queue']['avg']:.1f} s, util {s['gpu_utilization']:.4f}, "
            f"makespan {s['makespan']:.0f} s ({s['sim_wall_s']:.2f} s wall)"
        )
        return 0
    summaries = [r.summary for r in results]
    classes = [c.name for c in queues.priority_classes] if queues and queues.priority_classes else None
    from rallypoint.core.types import DEFAULT_PRIORITY_CLASSES

    order = classes or [c.name for c in sorted(DEFAULT_PRIORITY_CLASSES, key=lambda c: -c.value)]
    print(compare_table(summaries, top_class(summaries[0], order)))
    if args.json_out:
        from rallypoint.sim.run import clean

        Path(args.json_out).write_text(
            json.dumps(clean({s["policy"]: s for s in summaries}), indent=1) + "\n"
        )
    return 0
