"""``rally usage`` answered by the PostgreSQL read model: one query over ``rally.attempts``.

It must equal ``accounting.usage`` over the log to the bit, so the query evaluates the same float
expression per attempt as ``accounting.charged_gpu_s`` (``least``/``greatest`` skip a NULL bound as the
Python skips a None one) and adds each group's charges in (job id, attempt) order (``sum(... ORDER BY)``
accumulates in that order; ``COLLATE "C"`` sorts ids by code point as Python does).
"""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from rallypoint.accounting.usage import GroupSums, UsageReport, build_report, check_group_by

from .schema import SCHEMA

_KEY_COLUMN = {"team": "team", "user": "user_name", "class": "priority"}

_QUERY = f"""
WITH charged AS (
    SELECT job_id, attempt, {{key}} AS key, lost_gpu_s,
           CASE WHEN started_s IS NULL THEN 0.0::float8
                ELSE coalesce(gpu_milli::float8 / 1000, gpus)
                     * (least(coalesce(ended_s, $3::float8), $2::float8)
                             - greatest(started_s, $1::float8)) END AS span,
           ended_s IS NOT NULL AND ($1::float8 IS NULL OR ended_s >= $1::float8)
               AND ($2::float8 IS NULL OR ended_s < $2::float8) AS lost_inside
    FROM {SCHEMA}.attempts
)
SELECT key,
       coalesce(sum(span ORDER BY job_id COLLATE "C", attempt) FILTER (WHERE span > 0), 0.0) AS gpu_s,
       coalesce(sum(lost_gpu_s ORDER BY job_id COLLATE "C", attempt) FILTER (WHERE lost_inside), 0.0)
           AS lost_gpu_s,
       count(*) FILTER (WHERE span > 0) AS attempts,
       count(DISTINCT job_id) FILTER (WHERE span > 0) AS jobs
FROM charged
WHERE span > 0 OR lost_inside
GROUP BY key
ORDER BY key COLLATE "C"
"""


async def read_model_usage(
    conn: asyncpg.Connection,
    by: str,
    since: float | None,
    until: float | None,
    *,
    now: float,
    price_per_gpu_hour: float | None = None,
    nominals: Mapping[str, int] | None = None,
) -> UsageReport:
    check_group_by(by)
    rows = await conn.fetch(_QUERY.format(key=_KEY_COLUMN[by]), since, until, now)
    groups = [
        GroupSums(
            key=str(r["key"]),
            gpu_s=float(r["gpu_s"]),
            lost_gpu_s=float(r["lost_gpu_s"]),
            attempts=int(r["attempts"]),
            jobs=int(r["jobs"]),
        )
        for r in rows
    ]
    return build_report(
        groups,
        by=by,
        since=since,
        until=until,
        now=now,
        price_per_gpu_hour=price_per_gpu_hour,
        nominals=nominals,
        source="postgres",
    )
