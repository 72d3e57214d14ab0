"""Load inputs, run one or several policies, write outputs: what ``rally sim`` and the evaluation share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rallypoint.scheduling.queues import Queues, load_queues

from .cluster import Cluster, load_cluster
from .engine import SimOptions, SimResult, Simulator, core_api
from .workload import Job, load_workload


class InputError(ValueError):
    """Bad input named by the user (file, format, policy); the CLI prints it as one line."""


def load_inputs(
    workload: str | Path, cluster: str | Path, queues: str | Path | None
) -> tuple[list[Job], Cluster, Queues | None]:
    try:
        jobs = load_workload(workload)
        cl = load_cluster(cluster)
        q = load_queues(queues) if queues else None
    except ValueError as e:
        raise InputError(str(e)) from None
    return jobs, cl, q


def resolve_policy(name: str) -> Any:
    """The core's policy object for ``name``; unknown names are an InputError listing the known ones."""
    try:
        _, by_name = core_api()
    except ImportError as e:
        raise InputError(f"scheduling core not available: {e}") from None
    try:
        return by_name(name)
    except (KeyError, ValueError) as e:
        raise InputError(f"unknown policy {name!r} ({e})") from None


def run_policy(
    jobs: Sequence[Job],
    cluster: Cluster,
    queues: Queues | None,
    policy: str,
    options: SimOptions | None = None,
) -> SimResult:
    pol = resolve_policy(policy)
    return Simulator(jobs, cluster, policy, queues, options, policy_obj=pol).run()


def write_outputs(
    res: SimResult,
    queues: Queues | None,
    json_path: str | Path | None = None,
    per_job: str | Path | None = None,
    report: str | Path | None = None,
) -> None:
    if json_path:
        Path(json_path).write_bytes(msgspec.json.format(msgspec.json.encode(clean(res.summary))) + b"\n")
    if per_job:
        enc = msgspec.json.Encoder()
        with Path(per_job).open("wb") as f:
            for r in sorted(res.records, key=lambda r: (r.end, r.id)):
                f.write(enc.encode(r) + b"\n")
    if report:
        from .report import write_report

        nominal = queues.nominals() if queues else {}
        write_report(Path(report), res.summary, res.records, res.recorder, nominal)


def clean(obj: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, Mapping):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def top_class(summary: Mapping[str, Any], classes: Sequence[str] | None = None) -> str | None:
    """The most important priority class present (by the order given, else alphabetically first)."""
    present = list(summary.get("per_class", {}))
    for c in classes or ():
        if c in present:
            return c
    return present[0] if present else None


def compare_table(summaries: Sequence[Mapping[str, Any]], top: str | None = None) -> str:
    """A Markdown table, one row per policy."""
    head = ["policy", "done", "avg JCT s", "p50 JCT", "p99 JCT", "avg queue s", "p99 queue s"]
    if top:
        head.append(f"p99 queue {top}")
    head += ["util", "alloc", "preempt", "min quota ok", "Jain", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = [
            s["policy"],
            f"{s['completed']}/{s['jobs']}",
            _n(s["jct"]["avg"]),
            _n(s["jct"]["p50"]),
            _n(s["jct"]["p99"]),
            _n(s["queue"]["avg"]),
            _n(s["queue"]["p99"]),
        ]
        if top:
            row.append(_n(s["per_class"].get(top, {}).get("queue", {}).get("p99", math.nan)))
        row += [
            f"{s['gpu_utilization']:.3f}",
            f"{s['alloc_fraction']:.3f}",
            str(s["preemptions"]),
            f"{s['quota_honoured']['min']:.3f}",
            _n(s["jain_fairness"], 3),
            _n(s.get("sim_wall_s"), 1),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _n(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"
