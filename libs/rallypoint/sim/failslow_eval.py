"""The straggler section of ``make eval``: what replacing fail-slow nodes buys, in JCT and GPU-hours.

On Philly slices the evaluation already uses, the same policy runs four times on the same jobs and cluster:
without fail-slow episodes, with the seeded episodes of sim/failslow.py and no replacement (gangs run slow
until the episode ends), and with replacement by each of two detection rules (the live detector's
peer-relative rule, and a node-level check). Only the episodes and the response differ between the runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from rallypoint.traces import convert as cv

from .engine import SimOptions, Simulator
from .failslow import EpisodeModel, FailSlow, gang_slowdown
from .run import resolve_policy

POLICY = "rallypoint"
# (week, offered load, episode rate as a multiple of the default). 2017-10-23 has the most GPU-hours in
# multi-node gangs of the four weeks (25k of 124k; the others have < 10k), where a straggler holds a whole
# gang back; 2017-10-09 at 1.1 is the most loaded slice (the most queueing), where a restart and a cordoned
# node cost the most. The tenfold rate shows how the answer moves if our assumed rate is too low.
SLICES: tuple[tuple[str, float, float], ...] = (
    ("2017-10-23", 1.1, 1.0),
    ("2017-10-23", 1.1, 10.0),
    ("2017-10-09", 1.1, 1.0),
)
# Restoring a gang from its checkpoint and re-forming its collectives takes minutes (docs/health.md); the
# Philly conversion has no checkpoint overhead at all (preemption is free there), which would make a
# replacement look cheaper than it is, so replacements pay this. An assumption: no published figure.
RESTART_OVERHEAD_S = 300.0
VARIANTS = (
    "no fail-slow",
    "fail-slow, no replacement",
    "replacement, live rule (peers)",
    "replacement, node check",
)


def variants(model: EpisodeModel) -> dict[str, FailSlow | None]:
    base = FailSlow(model=model, restart_overhead_s=RESTART_OVERHEAD_S)
    return {
        VARIANTS[0]: None,
        VARIANTS[1]: base,
        VARIANTS[2]: msgspec.structs.replace(base, replace=True, detector="peers"),
        VARIANTS[3]: msgspec.structs.replace(base, replace=True, detector="node"),
    }


def _row(sim: Simulator, res_summary: Mapping[str, Any], hit: set[str], wall: float) -> dict[str, Any]:
    fs = res_summary.get("failslow") or {}
    hit_jct = [r.jct for r in sim.records if r.id in hit]
    return {
        "completed": res_summary["completed"],
        "jobs": res_summary["jobs"],
        "jct": res_summary["jct"],
        "hit_jobs": len(hit_jct),
        "hit_avg_jct": sum(hit_jct) / len(hit_jct) if hit_jct else math.nan,
        "slow_gpu_hours": fs.get("slow_gpu_hours", 0.0),
        "restart_gpu_hours": fs.get("restart_gpu_hours", 0.0),
        "replacements": fs.get("replacements", 0),
        "cordons": fs.get("cordons", 0),
        "episodes": fs.get("episodes", 0),
        "jobs_slowed": fs.get("jobs_slowed", 0),
        "wall_s": wall,
    }


def straggler_run(conv: cv.Converted, model: EpisodeModel, log: Any, tag: str) -> dict[str, Any]:
    """Every variant on one converted slice. The jobs slowed in the no-replacement run are the "hit"
    cohort whose avg JCT every row reports (JCT over all jobs dilutes what happens to them)."""
    pol = resolve_policy(POLICY)
    sims: dict[str, tuple[Simulator, dict[str, Any], float]] = {}
    for name, fs in variants(model).items():
        t = time.perf_counter()
        sim = Simulator(conv.jobs, conv.cluster, POLICY, conv.queues, SimOptions(failslow=fs), policy_obj=pol)
        summary = sim.run().summary
        wall = time.perf_counter() - t
        print(f"  stragglers {tag} {name}: {wall:.1f} s", file=log, flush=True)
        sims[name] = (sim, summary, wall)
    slowed = sims[VARIANTS[1]][0]
    hit = {jid for jid, sj in slowed.jobs.items() if sj.slow_gpu_s > 0}
    return {name: _row(sim, summary, hit, wall) for name, (sim, summary, wall) in sims.items()}


def gang_spans(conv: cv.Converted) -> dict[int, tuple[int, float]]:
    """Nodes a job needs at least (its tasks) -> (jobs, GPU-hours): the peer rule can judge only gangs on
    three nodes or more (two, for a node 2.5x slower)."""
    out: dict[int, tuple[int, float]] = {}
    for j in conv.jobs:
        n = -(-j.gpus // j.task_gpus)
        jobs, gh = out.get(n, (0, 0.0))
        out[n] = (jobs + 1, gh + j.gpus * j.duration / 3600.0)
    return dict(sorted(out.items()))


def straggler_runs(
    traces: Path, log: Any, slices: Sequence[tuple[str, float, float]] = SLICES
) -> list[dict[str, Any]]:
    out = []
    for week, load, rate in slices:
        conv = cv.convert_philly(
            traces / "philly" / "philly_open.csv",
            traces / "philly" / "philly_vc.csv",
            datetime.fromisoformat(week),
            7.0,
            target_load=load,
        )
        model = EpisodeModel()
        model = msgspec.structs.replace(model, mean_gap_s=model.mean_gap_s / rate)
        tag = f"philly-{week}-load{load:g}-rate{rate:g}x"
        out.append(
            {
                "tag": tag,
                "week": week,
                "load": load,
                "rate": rate,
                "gap_days": model.mean_gap_s / 86400.0,
                "info": conv.info,
                "spans": gang_spans(conv),
                "rows": straggler_run(conv, model, log, tag),
            }
        )
    return out


def _n(v: float, digits: int = 0) -> str:
    return "-" if isinstance(v, float) and math.isnan(v) else f"{v:,.{digits}f}"


def render_section(runs: Sequence[Mapping[str, Any]], number: int) -> list[str]:
    """The Markdown of the section: how episodes are drawn and handled, then one table per slice."""
    m = EpisodeModel()
    big = gang_slowdown(128, m)
    L = [f"## {number}. Stragglers: fail-slow nodes, with and without replacement\n"]
    L.append(
        f"Policy `{POLICY}`. Fail-slow episodes per node (`rallypoint.sim.failslow`, seeded): duration "
        f"log-uniform on [{m.min_duration_s:.0f} s, {m.max_duration_s / 3600:.0f} h] (Falcon, ATC'25: "
        '"tens of seconds to nearly ten hours"), slowdown 1 + Exp(mean '
        f"{m.mean_extra}) capped at {m.max_factor:g}x (mean 1.34x, Falcon's average delay; per-episode use "
        f"is our assumption), one episode per {m.mean_gap_s / 86400:g} days of healthy time per node on "
        "average (no published rate; an assumption: at this rate a 128-node gang runs "
        f"{big:.2f}x slower on average, the order of Falcon's 1.34x on its >10k-GPU cluster). A gang "
        "advances at the pace of its slowest node. Replacement: the detection rule runs once the gang "
        "has been slowed for the live detector's window (300 s); a flagged node is cordoned until its "
        "episode ends plus 1 h, and the gang restarts from its last checkpoint (every 30 min) paying "
        f"{RESTART_OVERHEAD_S:.0f} s of restore (an assumption), as for a node failure; the core places "
        "it again. *Live rule (peers)*: the health detector's rule (`health/stragglers.py`: a node whose "
        "ranks are above 1/0.7 x the gang's median), which needs healthy peers in the same gang: a gang on "
        "one node is never flagged, and with two nodes the slow one must be 2.5x slower. *Node check*: "
        "any node slower than 1/0.7 is flagged, as a benchmark on the node itself would (the live health "
        "detector's throttling signal catches only the fail-slows that show as GPU throttling). GPU-hours "
        "lost: *slowness* = GPU time held beyond what the work needed at full speed; *restarts* = work "
        "redone after a replacement plus its restore. *Hit jobs*: the jobs slowed in the no-replacement run, "
        "the same set in every row.\n"
    )
    L.append(
        "Slices: 2017-10-23 has by far the most GPU-hours in multi-node gangs of the four weeks (25k of "
        "124k), where one slow node holds a whole gang back; there also at ten times the assumed rate, in "
        "case the rate is too low; and 2017-10-09 at load 1.1, the most loaded slice, where a restart "
        "and a cordoned node cost the most. This section alone: `python -m rallypoint.sim.evaluate "
        "--skip-philly --skip-openb` (the same numbers; the wall times vary with the machine). Details: "
        'docs/simulator.md, "Fail-slow nodes and straggler replacement".\n'
    )
    for run in runs:
        info = run["info"]
        L.append(
            f"### {run['tag']}\n\n{info['jobs']:,} jobs, {info['gpus']} GPUs, offered load "
            f"{info['offered_load']:.3f}; one episode per {run['gap_days']:.2g} days per node. "
            + _spans_text(run.get("spans", {}))
            + "\n"
        )
        L.append(
            "| run | done | avg JCT s | p50 JCT | p95 JCT | p99 JCT | hit jobs: avg JCT s | GPU-h lost: "
            "slowness | restarts | total | episodes | jobs slowed | replacements | cordons | wall s |"
        )
        L.append("|" + "---|" * 15)
        for name, r in run["rows"].items():
            j = r["jct"]
            total = r["slow_gpu_hours"] + r["restart_gpu_hours"]
            L.append(
                f"| {name} | {r['completed']}/{r['jobs']} | {_n(j['avg'])} | {_n(j['p50'])} | "
                f"{_n(j['p95'])} | {_n(j['p99'])} | {_n(r['hit_avg_jct'])} ({r['hit_jobs']}) | "
                f"{_n(r['slow_gpu_hours'], 1)} | {_n(r['restart_gpu_hours'], 1)} | {_n(total, 1)} | "
                f"{r['episodes']} | {r['jobs_slowed']} | {r['replacements']} | {r['cordons']} | "
                f"{r['wall_s']:.1f} |"
            )
        L.append("")
        L.extend(_buys(run["rows"]))
    return L


def _spans_text(spans: Mapping[int, tuple[int, float]]) -> str:
    total = sum(gh for _, gh in spans.values())
    if not total:
        return ""
    parts = [
        f"{n} node{'s' if n > 1 else ''}: {jobs:,} ({gh / total:.1%})" for n, (jobs, gh) in spans.items()
    ]
    return "Jobs by tasks (nodes), with their share of GPU-hours: " + "; ".join(parts) + "."


def _buys(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One sentence per replacement rule: what it changed against running slow, and what share of the
    avg-JCT cost of fail-slow it won back (negative: it made things worse)."""
    off, slow = rows[VARIANTS[0]], rows[VARIANTS[1]]
    cost = slow["jct"]["avg"] - off["jct"]["avg"]
    lost = slow["slow_gpu_hours"] + slow["restart_gpu_hours"]
    out = []
    for name in VARIANTS[2:]:
        r = rows[name]
        delta = r["jct"]["avg"] - slow["jct"]["avg"]
        won = f"{0.0 - delta / cost:.0%}" if cost > 0 else "-"  # 0.0 - x: no "-0%" when nothing changed
        lost_delta = r["slow_gpu_hours"] + r["restart_gpu_hours"] - lost
        out.append(
            f"- *{name}*, against running slow: avg JCT {delta:+,.0f} s (fail-slow added {cost:,.0f} s; "
            f"share won back {won}), hit jobs' avg JCT {r['hit_avg_jct'] - slow['hit_avg_jct']:+,.0f} s, "
            f"GPU-hours lost {lost_delta:+,.1f}."
        )
    return [*out, ""]
