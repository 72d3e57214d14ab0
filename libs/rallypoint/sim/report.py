"""--report DIR: an HTML page with plots, each also a PNG.

Plots: utilization and queue length over time, JCT CDF per priority class, per-team share vs quota.
matplotlib is an optional dependency (extra ``report``); it is imported only here, with the Agg backend.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .metrics import JobRecord, Recorder


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(rec: Recorder, path: Path, title: str = "") -> None:
    plt = _plt()
    fig, ax1 = plt.subplots(figsize=(8, 3.2), dpi=90)
    t = [x / 3600.0 for x in rec.series_t]
    g = rec.total_gpus or 1
    ax1.step(t, [a / g for a in rec.series_alloc], where="post", color="tab:blue", lw=0.8)
    ax1.set_ylabel("GPUs allocated (fraction)", color="tab:blue")
    ax1.set_ylim(0, 1.05)
    ax1.set_xlabel("hours")
    ax2 = ax1.twinx()
    ax2.step(t, rec.series_pending, where="post", color="tab:red", lw=0.8)
    ax2.set_ylabel("jobs waiting", color="tab:red")
    ax1.set_title(title or "utilization and queue length")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_jct_cdf(records: Sequence[JobRecord], path: Path, title: str = "") -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=90)
    by: dict[str, list[float]] = {}
    for r in records:
        by.setdefault(r.priority, []).append(max(r.jct, 1.0))
    for cls, v in sorted(by.items()):
        v.sort()
        n = len(v)
        ax.step(v, [(i + 1) / n for i in range(n)], where="post", label=f"{cls} ({n})", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("fraction of jobs")
    ax.legend(fontsize=7)
    ax.set_title(title or "JCT CDF per priority class")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_team_share(rec: Recorder, nominal: Mapping[str, int], path: Path, title: str = "") -> None:
    plt = _plt()
    teams = sorted(set(rec.teams) | set(nominal))
    span = (rec.t_prev or 0.0) - (rec.series_t[0] if rec.series_t else 0.0)
    g = rec.total_gpus or 1
    used = [rec.teams[t].alloc_gpu_s / (g * span) if t in rec.teams and span > 0 else 0.0 for t in teams]
    quota = [nominal.get(t, 0) / g for t in teams]
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(teams) + 2), 3.2), dpi=90)
    xs = range(len(teams))
    ax.bar([x - 0.2 for x in xs], used, width=0.4, label="time-avg share held")
    ax.bar([x + 0.2 for x in xs], quota, width=0.4, label="nominal quota")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(teams, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("fraction of cluster GPUs")
    ax.legend(fontsize=7)
    ax.set_title(title or "per-team share vs quota")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:,.4g}" if abs(v) < 10 else f"{v:,.1f}"
    return html.escape(str(v))


def write_report(
    out_dir: Path,
    summary: Mapping[str, Any],
    records: Sequence[JobRecord],
    rec: Recorder,
    nominal: Mapping[str, int],
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {
        "timeline.png": "Utilization and queue length over time",
        "jct_cdf.png": "JCT CDF per priority class",
        "team_share.png": "Per-team share vs quota",
    }
    plot_timeline(rec, out_dir / "timeline.png")
    plot_jct_cdf(records, out_dir / "jct_cdf.png")
    plot_team_share(rec, nominal, out_dir / "team_share.png")
    rows = [("jobs / completed", f"{summary['jobs']} / {summary['completed']}")]
    for k in ("jct", "queue", "bounded_slowdown"):
        d = summary[k]
        rows.append((k, " / ".join(f"{q} {_fmt(d[q])}" for q in ("avg", "p50", "p95", "p99"))))
    for k in (
        "makespan",
        "gpu_utilization",
        "alloc_fraction",
        "preemptions",
        "gpu_hours_lost",
        "multi_node_one_rack_share",
        "jain_fairness",
    ):
        rows.append((k, _fmt(summary[k])))
    rows.append(("quota honoured (min over teams)", _fmt(summary["quota_honoured"]["min"])))
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    figs = "\n".join(
        f'<h2>{html.escape(t)}</h2><img src="{f}" alt="{html.escape(t)}">' for f, t in plots.items()
    )
    pol = html.escape(str(summary["policy"]))
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>rally sim: {pol}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:auto}}th{{text-align:left;padding-right:1em}}</style>
</head><body><h1>rally sim — policy {html.escape(str(summary["policy"]))}</h1>
<table>{table}</table>
{figs}
<h2>Summary (JSON)</h2><pre>{html.escape(json.dumps(summary, indent=1, default=str))}</pre>
</body></html>"""
    (out_dir / "index.html").write_text(page)
    return out_dir / "index.html"
