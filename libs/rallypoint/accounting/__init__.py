"""Accounting over the log: every attempt (``attempts``), usage by team/user/class (``usage``), finished
jobs (``sacct``) and queue occupancy (``queues_view``). Pure: the API, the projector and the CLI call it."""

from .attempts import AttemptLedger, AttemptRecord, charged_gpu_s, fold_attempts, user_of
from .queues_view import CohortRow, OrgRow, QueueRow, QueuesReport, queues_report
from .sacct import FinishedJob, finished_job, finished_jobs
from .usage import GROUP_BY, GroupSums, UsageReport, UsageRow, build_report, group_sums, usage

__all__ = [
    "GROUP_BY",
    "AttemptLedger",
    "AttemptRecord",
    "CohortRow",
    "FinishedJob",
    "GroupSums",
    "OrgRow",
    "QueueRow",
    "QueuesReport",
    "UsageReport",
    "UsageRow",
    "build_report",
    "charged_gpu_s",
    "finished_job",
    "finished_jobs",
    "fold_attempts",
    "group_sums",
    "queues_report",
    "usage",
    "user_of",
]
