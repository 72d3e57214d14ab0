"""Prometheus text exposition of the API's fold, written by hand: a few gauges do not need a library."""

from __future__ import annotations

from collections import Counter
from typing import get_args

from rallypoint.state import ClusterState, JobState

PROMETHEUS_CONTENT_TYPE = "text/plain"  # aiohttp adds the charset; version=0.0.4 is the default format

JOB_STATES: tuple[str, ...] = get_args(JobState)


def _family(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def render_metrics(state: ClusterState, submissions: Counter[str], *, following: bool) -> str:
    lines: list[str] = []
    jobs: Counter[str] = Counter(job.state for job in state.jobs.values())
    _family(lines, "rally_jobs", "gauge", "Jobs by state, as folded from the log.")
    # Every state is listed, zeros included, so a dashboard's series never disappear.
    for job_state in JOB_STATES:
        lines.append(f'rally_jobs{{state="{job_state}"}} {jobs.get(job_state, 0)}')

    # Nodes and GPUs by status are the schedulers' (rally_nodes, rally_gpus: docs/observability.md), one
    # name per quantity; the API keeps what only it knows.
    _family(lines, "rally_log_fold_seq", "gauge", "Last stream sequence this fold applied.")
    lines.append(f"rally_log_fold_seq {state.last_seq}")
    _family(lines, "rally_api_following", "gauge", "1 while this instance is following the log live.")
    lines.append(f"rally_api_following {int(following)}")

    _family(lines, "rally_api_submissions_total", "counter", "Job submissions by outcome since start.")
    for outcome in sorted(submissions):
        lines.append(f'rally_api_submissions_total{{outcome="{outcome}"}} {submissions[outcome]}')
    return "\n".join(lines) + "\n"


def read_index_metrics(reads: int, questions: int) -> str:
    """How many reads asked where the log ends, and how many questions the server got for them."""
    lines: list[str] = []
    _family(lines, "rally_api_read_index_reads_total", "counter", "Reads that waited for the log's tip.")
    lines.append(f"rally_api_read_index_reads_total {reads}")
    help_text = "Stream info requests sent for them (concurrent reads share one)."
    _family(lines, "rally_api_read_index_questions_total", "counter", help_text)
    lines.append(f"rally_api_read_index_questions_total {questions}")
    return "\n".join(lines) + "\n"
