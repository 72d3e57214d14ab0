"""GPU-hours by team, user or priority class over a time window (``rally usage``, like ``sreport``).

Two sources give the same numbers: the log (``usage(ledger.records(), ...)``) and the PostgreSQL read
model (``projection.usage``, one SQL query). To be identical to the bit, not just close, both compute each
attempt's charge with the same float expression (``charged_gpu_s``) and add the charges of a group in the
same order, (job id, attempt), starting from the first; ``build_report`` then turns either's per-group
sums into the report, so shares, hours and cost are computed once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from .attempts import AttemptRecord, charged_gpu_s

GroupBy = Literal["team", "user", "class"]
GROUP_BY: tuple[str, ...] = ("team", "user", "class")


class GroupSums(msgspec.Struct, kw_only=True):
    """What both sources compute per group; everything else in the report derives from these."""

    key: str
    gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    attempts: int = 0
    jobs: int = 0


class UsageRow(msgspec.Struct, kw_only=True):
    key: str
    gpu_s: float
    gpu_hours: float
    lost_gpu_s: float
    lost_gpu_hours: float
    attempts: int
    jobs: int
    #: this group's part of all GPU-seconds used in the window (0..1)
    share: float
    #: guaranteed GPUs and their part of all guarantees (by team, when a queue file is configured)
    nominal_gpus: int | None = None
    quota_share: float | None = None
    cost: float | None = None


class UsageReport(msgspec.Struct, kw_only=True):
    by: str
    since: float | None
    until: float | None
    now: float
    price_per_gpu_hour: float | None
    rows: list[UsageRow]
    total_gpu_s: float
    total_gpu_hours: float
    total_lost_gpu_s: float
    total_cost: float | None = None
    source: str = "log"


def check_group_by(by: str) -> None:
    if by not in GROUP_BY:
        raise ValueError(f"cannot group usage by {by!r}; one of {', '.join(GROUP_BY)}")


def group_key(rec: AttemptRecord, by: str) -> str:
    if by == "team":
        return rec.team
    if by == "user":
        return rec.user
    check_group_by(by)
    return rec.priority


def _ended_inside(rec: AttemptRecord, since: float | None, until: float | None) -> bool:
    """Lost work is booked when its attempt ended: inside [since, until)."""
    if rec.ended_at is None:
        return False
    return (since is None or rec.ended_at >= since) and (until is None or rec.ended_at < until)


def group_sums(
    records: Iterable[AttemptRecord], by: str, since: float | None, until: float | None, now: float
) -> list[GroupSums]:
    """Per group, sorted by key. ``records`` must come in (job id, attempt) order (``ledger.records()``)."""
    sums: dict[str, GroupSums] = {}
    jobs: dict[str, set[str]] = {}
    for rec in records:
        charge = charged_gpu_s(rec, since, until, now)
        lost = _ended_inside(rec, since, until)
        if charge <= 0 and not lost:
            continue
        key = group_key(rec, by)
        group = sums.get(key)
        if group is None:
            group = sums[key] = GroupSums(key=key)
        if charge > 0:
            group.gpu_s += charge
            group.attempts += 1
            jobs.setdefault(key, set()).add(rec.job_id)
        if lost:
            group.lost_gpu_s += rec.lost_gpu_s
    for key, group in sums.items():
        group.jobs = len(jobs.get(key, ()))
    return [sums[k] for k in sorted(sums)]


def build_report(
    groups: list[GroupSums],
    *,
    by: str,
    since: float | None,
    until: float | None,
    now: float,
    price_per_gpu_hour: float | None = None,
    nominals: Mapping[str, int] | None = None,
    source: str = "log",
) -> UsageReport:
    """The report from per-group sums (either source's), groups in key order."""
    total = 0.0
    lost_total = 0.0
    for group in groups:
        total += group.gpu_s
        lost_total += group.lost_gpu_s
    guaranteed = sum(nominals.values()) if nominals else 0
    rows = []
    for group in groups:
        nominal = nominals.get(group.key, 0) if nominals is not None and by == "team" else None
        rows.append(
            UsageRow(
                key=group.key,
                gpu_s=group.gpu_s,
                gpu_hours=group.gpu_s / 3600,
                lost_gpu_s=group.lost_gpu_s,
                lost_gpu_hours=group.lost_gpu_s / 3600,
                attempts=group.attempts,
                jobs=group.jobs,
                share=group.gpu_s / total if total > 0 else 0.0,
                nominal_gpus=nominal,
                quota_share=(nominal / guaranteed if guaranteed else 0.0) if nominal is not None else None,
                cost=None if price_per_gpu_hour is None else group.gpu_s / 3600 * price_per_gpu_hour,
            )
        )
    return UsageReport(
        by=by,
        since=since,
        until=until,
        now=now,
        price_per_gpu_hour=price_per_gpu_hour,
        rows=rows,
        total_gpu_s=total,
        total_gpu_hours=total / 3600,
        total_lost_gpu_s=lost_total,
        total_cost=None if price_per_gpu_hour is None else total / 3600 * price_per_gpu_hour,
        source=source,
    )


def usage(
    records: Iterable[AttemptRecord],
    by: str,
    since: float | None,
    until: float | None,
    *,
    now: float,
    price_per_gpu_hour: float | None = None,
    nominals: Mapping[str, int] | None = None,
) -> UsageReport:
    """Usage from attempts in (job id, attempt) order, e.g. ``fold_attempts(events)[1].records()``."""
    check_group_by(by)
    groups = group_sums(records, by, since, until, now)
    return build_report(
        groups,
        by=by,
        since=since,
        until=until,
        now=now,
        price_per_gpu_hour=price_per_gpu_hour,
        nominals=nominals,
    )
