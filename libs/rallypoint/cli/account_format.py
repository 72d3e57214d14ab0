"""Tables for `rally show | history | usage | queues`: presentation of the API's JSON, nothing more."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any

from .jobs_cmds import format_elapsed, format_table, gpus_held, hostlist, start_text
from .node_cmds import plan_text


def when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def hours(gpu_s: float) -> str:
    return f"{gpu_s / 3600:.4f}"


def format_show(h: dict[str, Any]) -> str:
    spec = h["spec"]
    # the GPUs the attempt under way holds (an elastic gang grown to 16 shows 16), as `rally jobs` shows them
    current = next((a for a in reversed(h["attempts"]) if a["ended_at"] is None), None)
    held = gpus_held(
        {"gpus": spec["gpus"], "spec": spec, "allocation": current["placements"] if current else []}
    )
    lines = [
        f"JobId={h['job_id']} JobName={spec['name']} Team={spec['team']} Priority={spec['priority']}",
        f"   JobState={h['state'].upper()} Reason={h['reason'] or '-'}"
        f" ExitCode={'-' if h['exit_code'] is None else h['exit_code']}"
        f" Queue={h['queue'] or '-'}",
        f"   Gpus={held} GpusPerNode={spec['gpus_per_task']} RanksPerNode={spec['ranks_per_task']}"
        f" MaxRetries={spec['max_retries']} TimeLimit={spec['time_limit_s'] or 'UNLIMITED'}",
        # shell-quoted, so it can be pasted back into a shell as it was submitted
        f"   Command={shlex.join(spec['command'])}",
        f"   SubmitTime={when(h['submitted_at'])} EndTime={when(h['ended_at'])}"
        f" LostGpuHours={hours(h['lost_gpu_s'])}",
    ]
    if h.get("predicted_start"):
        lines.append(f"   PredictedStart={start_text(h['predicted_start'], now=time.time(), long=True)}")
    if h.get("last_interruption"):
        lines.append(f"   LastInterruption={h['last_interruption']}")
    if h.get("drain"):
        lines.append(f"   {drain_line(h['drain'], now=time.time())}")
    if h.get("cancel_requested_by"):
        lines.append(f"   CancelRequestedBy={h['cancel_requested_by']}")
    if h.get("cancel_reason"):
        lines.append(f"   CancelReason={h['cancel_reason']}")
    lines.append("Attempts:")
    rows = [
        (
            a["attempt"],
            a["outcome"],
            hostlist(list(dict.fromkeys(p["node_id"] for p in a["placements"]))),
            a["gpus"],
            when(a["started_at"]),
            when(a["ended_at"]),
            a["reason"] or a.get("preempted_for") or "-",
        )
        for a in h["attempts"]
    ]
    lines.append(_indent(format_table(("#", "OUTCOME", "NODES", "GPUS", "START", "END", "WHY"), rows)))
    if h["reasons"]:
        lines.append("Pending reasons:")
        lines.extend(f"   {when(r['at'])} {r['code']}: {r['message']}" for r in h["reasons"])
    if h["preemptions"]:
        lines.append("Preemptions:")
        lines.extend(
            f"   attempt {p['attempt']}: for {p['for_job']} ({p['reason']})"
            f" requested {when(p['requested_at'])}"
            f" stopped {when(p['preempted_at'])} lost {p['lost_gpu_s']:.1f} GPU-s"
            for p in h["preemptions"]
        )
    if h["recovery"]:
        lines.append("Recovery:")
        for step in h["recovery"]:
            nodes = f" nodes {','.join(step['failed_nodes'])}" if step["failed_nodes"] else ""
            lines.append(
                f"   {when(step['at'])} attempt {step['attempt']} {step['kind']}{nodes} {step['reason']}"
            )
    if h["checkpoints"]:
        lines.append("Checkpoints:")
        lines.extend(
            f"   step {c['step']} (attempt {c['attempt']}) {c['status']}"
            f" {when(c['committed_at'])} {c['path']}"
            for c in h["checkpoints"]
        )
    return "\n".join(lines)


def drain_line(drain: dict[str, Any], *, now: float) -> str:
    """``Drain=node-4 (maintenance): interrupted after its next checkpoint, at the latest at ...``."""
    return f"Drain={drain['node']} ({drain['reason']}): {plan_text(drain, now=now)}"


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.splitlines())


def format_history(jobs: Sequence[dict[str, Any]]) -> str:
    headers = (
        "JOBID",
        "NAME",
        "TEAM",
        "STATE",
        "EXIT",
        "QUEUED",
        "ELAPSED",
        "GPUS",
        "GPU-H",
        "ATT",
        "LOST-GPU-H",
    )
    rows = [
        (
            j["job_id"],
            j["name"],
            j["team"],
            j["state"],
            "-" if j["exit_code"] is None else j["exit_code"],
            format_elapsed(j["queue_s"]),
            format_elapsed(j["run_s"]),
            j["gpus"],
            hours(j["gpu_s"]),
            j["attempts"],
            hours(j["lost_gpu_s"]),
        )
        for j in jobs
    ]
    return format_table(headers, rows)


def format_usage(report: dict[str, Any]) -> str:
    priced = report.get("price_per_gpu_hour") is not None
    headers = [report["by"].upper(), "GPU-HOURS", "SHARE", "LOST-GPU-HOURS", "ATTEMPTS", "JOBS"]
    quotas = any(r.get("nominal_gpus") is not None for r in report["rows"])
    if quotas:
        headers += ["NOMINAL", "QUOTA-SHARE"]
    if priced:
        headers.append("COST")
    rows = []
    for r in report["rows"]:
        row: list[object] = [
            r["key"],
            f"{r['gpu_hours']:.4f}",
            f"{r['share']:.1%}",
            f"{r['lost_gpu_hours']:.4f}",
            r["attempts"],
            r["jobs"],
        ]
        if quotas:
            share = r.get("quota_share")
            row += [r.get("nominal_gpus") or 0, "-" if share is None else f"{share:.1%}"]
        if priced:
            row.append(f"{r['cost']:.2f}")
        rows.append(row)
    total: list[object] = [
        "TOTAL",
        f"{report['total_gpu_hours']:.4f}",
        "100.0%" if rows else "-",
        f"{report['total_lost_gpu_s'] / 3600:.4f}",
        "",
        "",
    ]
    if quotas:
        total += ["", ""]
    if priced:
        total.append(f"{report['total_cost']:.2f}")
    return format_table(headers, [*rows, total])


def _g(gpus: float) -> str:
    """GPUs as counted against quota: whole (``3``) or with a share's part (``2.25``)."""
    return f"{gpus:g}"


def format_queues(report: dict[str, Any]) -> str:
    quotas = report["quotas"]
    headers = ("TEAM", "COHORT", "NOMINAL", "BORROWED", "USED", "RUNNING", "PENDING-JOBS", "PENDING-GPUS")
    rows = [
        (
            t["team"],
            t["cohort"],
            "no quota" if not quotas or t["nominal"] is None else t["nominal"],
            _g(t["borrowed"]) if quotas else "-",
            _g(t["used"]),
            t["running_jobs"],
            t["pending_jobs"],
            _g(t["pending_gpus"]),
        )
        for t in report["teams"]
    ]
    text = format_table(headers, rows)
    # each team's users, lightest first per weight: the order fair share between them gives their jobs
    user_rows = [
        (
            t["team"],
            u["user"],
            f"{u['weight']:g}",
            f"{u['usage_gpu_h']:.2f}",
            _g(u["running_gpus"]),
            u["pending_jobs"],
        )
        for t in report["teams"]
        for u in t.get("users", ())
    ]
    if user_rows:
        user_headers = ("TEAM", "USER", "WEIGHT", "USAGE-GPU-H", "RUNNING-GPUS", "PENDING-JOBS")
        text += "\n\n" + format_table(user_headers, user_rows)
    if quotas and report["cohorts"]:
        cohort_rows = [
            (
                c["cohort"],
                ",".join(c["teams"]),
                c["nominal"],
                _g(c["borrowed"]),
                _g(c["used"]),
                _g(c["pending_gpus"]),
            )
            for c in report["cohorts"]
        ]
        text += "\n\n" + format_table(
            ("COHORT", "TEAMS", "NOMINAL", "BORROWED", "USED", "PENDING-GPUS"), cohort_rows
        )
    if quotas and report.get("orgs"):
        org_rows = [
            (
                o["org"],
                o["parent"] or "-",
                ",".join(o["teams"]) or "-",
                "no limit" if o["limit"] is None else o["limit"],
                _g(o["used"]),
                _g(o["pending_gpus"]),
            )
            for o in report["orgs"]
        ]
        text += "\n\n" + format_table(("ORG", "PARENT", "TEAMS", "LIMIT", "USED", "PENDING-GPUS"), org_rows)
    free, total = report["free_gpus"], report["total_gpus"]
    return text + f"\n\n{total - free}/{total} GPUs in use"
