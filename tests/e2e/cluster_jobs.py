"""Job requests the end-to-end tests send to a local cluster's API, in one place.

``submit`` posts a job (a 1-GPU, 1-rank task of team ``e2e`` unless told otherwise) and returns its id;
``job`` reads its view and ``wait_for`` polls it until a condition holds. They assert the API's answer, so
a test fails on the request that went wrong. A test module with other defaults binds them once:
``submit = partial(cluster_jobs.submit, team="obs")``. ``log_records`` reads the whole log, for the tests
that check it; ``assert_each_ran_once`` checks in it that every job started, ran and completed once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rallypoint.eventlog import EventLog
from rallypoint.events import Event, JobCompleted, JobStarted, RankExited, subjects
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call


def submit(
    cluster: LocalCluster,
    name: str,
    command: list[str],
    *,
    team: str = "e2e",
    gpus: int = 1,
    gpus_per_task: int = 1,
    ranks_per_task: int = 1,
    **fields: Any,
) -> str:
    body: dict[str, Any] = {
        "name": name,
        "team": team,
        "gpus": gpus,
        "gpus_per_task": gpus_per_task,
        "ranks_per_task": ranks_per_task,
        "command": command,
        **fields,
    }
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    status, view = call("GET", f"{cluster.api_url}/v1/jobs/{job_id}")
    assert status == 200, view
    return dict(view)


def wait_for(
    cluster: LocalCluster, job_id: str, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float = 90.0
) -> dict[str, Any]:
    """The job's view once ``ok`` holds for it; fails naming ``what`` never happened, and the last view."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = job(cluster, job_id)
        if ok(seen):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never {what}; last seen {seen}")


def log_records(cluster: LocalCluster, name: str) -> list[tuple[int, Event]]:
    """The cluster's whole log as (seq, event), read over a connection named ``name``: a ``GangsBound``'s
    binds each at its sequence, as every fold reads them."""

    async def read() -> list[tuple[int, Event]]:
        log = await EventLog.connect(cluster.nats_url, name=name, create=False)
        try:
            return [(rec.seq, event) async for rec in log.replay() for event in subjects.members(rec.event)]
        finally:
            await log.close()

    return asyncio.run(read())


def assert_each_ran_once(records: Sequence[Event], jobs: Sequence[str]) -> None:
    """Every one of ``jobs`` completed once, after one start of one attempt, every rank exiting once: none
    lost, none run twice (what a killed replica must never cause)."""
    started = Counter((e.job_id, e.attempt) for e in records if isinstance(e, JobStarted))
    exits = Counter((e.job_id, e.attempt, e.rank) for e in records if isinstance(e, RankExited))
    completed = Counter(e.job_id for e in records if isinstance(e, JobCompleted))
    assert set(completed) == set(jobs) and set(completed.values()) == {1}, completed
    assert set(started.values()) == {1} and {job for job, _ in started} == set(jobs), started
    assert set(exits.values()) == {1}, exits  # every rank ran once
