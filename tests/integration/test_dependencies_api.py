"""Dependencies through the API and the real scheduler on real NATS (issue 35, Build item 1).

A job that waits on another is accepted only when that job exists, is the team's (an admin may name any
team's) and can still meet the dependency; it is shown as held with the reason, the scheduler leaves it
alone while it is held, and binds it at the first cycle after its dependency is met.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.scheduler.leader import SchedulerLoop
from test_api_tenant_views import _append, _register_nodes, _token_file
from test_scheduler_cycle_writes import _cycle, _leading

from rallypoint.eventlog import EventLog
from rallypoint.events import JobCompleted, JobFailed, JobStarted
from rallypoint.security.tokens import TokenStore

Client = test_utils.TestClient[web.Request, web.Application]
_clock = itertools.count(2000)


@dataclass
class Cluster:
    client: Client
    tokens: dict[str, str]
    log: EventLog
    loop: SchedulerLoop

    async def post(self, who: str, body: dict[str, Any], query: str = "") -> tuple[int, dict[str, Any]]:
        resp = await self.client.post(
            f"/v1/jobs{query}", json=body, headers={"Authorization": f"Bearer {self.tokens[who]}"}
        )
        return resp.status, await resp.json()

    async def submit(self, who: str, name: str, **extra: Any) -> str:
        status, body = await self.post(who, {"name": name, "gpus": 8, "command": ["x"], **extra})
        assert status == 202, body
        return str(body["job_id"])

    async def view(self, who: str, job_id: str) -> dict[str, Any]:
        await self.loop.follower.wait_for(await self.log.last_seq())
        resp = await self.client.get(
            f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {self.tokens[who]}"}
        )
        assert resp.status == 200
        return dict(await resp.json())

    async def run_to_end(self, job_id: str, *, ok: bool) -> None:
        attempt = self.loop.state.jobs[job_id].attempt
        await _append(self.log, JobStarted(job_id=job_id, attempt=attempt, at=next(_clock)), f"{job_id}:s")
        end = (
            JobCompleted(job_id=job_id, attempt=attempt, at=next(_clock))
            if ok
            else JobFailed(job_id=job_id, attempt=attempt, reason="exit 1", exit_code=1, at=next(_clock))
        )
        await _append(self.log, end, f"{job_id}:end")


@pytest.fixture
async def cluster(event_log: EventLog, tmp_path: Path) -> AsyncIterator[Cluster]:
    await _register_nodes(event_log)  # two 8-GPU nodes
    tokens = _token_file(tmp_path / "tokens.json")
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tmp_path / "tokens.json"))
    async with test_utils.TestClient(test_utils.TestServer(app)) as client, _leading(event_log) as loop:
        yield Cluster(client=client, tokens=tokens, log=event_log, loop=loop)


def _after(kind: str, job_id: str) -> list[dict[str, str]]:
    return [{"kind": kind, "job_id": job_id}]


async def test_a_held_job_waits_for_its_dependency_then_binds_at_the_next_cycle(cluster: Cluster) -> None:
    prep = await cluster.submit("nlp", "prep")
    train = await cluster.submit("nlp", "train", depends_on=_after("after-ok", prep))
    await _cycle(cluster.log, cluster.loop)
    state = cluster.loop.state
    assert (
        state.jobs[prep].state == "bound" and state.jobs[train].state == "pending"
    )  # a free node stays free
    view = await cluster.view("nlp", train)
    assert view["depends_on"] == [{"kind": "after-ok", "job_id": prep}]
    assert view["pending_reason"] == {
        "code": "Dependency",
        "message": f"waiting for {prep} to complete (after-ok)",
    }

    status, dry = await cluster.post(
        "nlp",
        {"name": "eval", "gpus": 8, "command": ["x"], "depends_on": _after("after-ok", prep)},
        "?dry_run=true",
    )
    assert status == 200 and dry["placement"] is None and dry["reason"]["code"] == "Dependency", dry

    await cluster.run_to_end(prep, ok=True)
    await _cycle(cluster.log, cluster.loop)
    assert cluster.loop.state.jobs[train].state == "bound"


async def test_a_dependency_that_cannot_be_met_or_is_not_the_team_s_is_refused(cluster: Cluster) -> None:
    failed = await cluster.submit("nlp", "broken")
    await _cycle(cluster.log, cluster.loop)
    await cluster.run_to_end(failed, ok=False)
    theirs = await cluster.submit("vision", "their-prep")
    await cluster.loop.follower.wait_for(await cluster.log.last_seq())
    before = await cluster.log.last_seq()

    cases = [
        (_after("after-ok", failed), f"after-ok on {failed} can never be met: it failed"),
        (_after("after-ok", "j-000000000000"), "job 'j-000000000000' does not exist"),
        (_after("after-any", theirs), f"job '{theirs}' does not exist"),  # another team's: not to learn of
    ]
    for depends_on, detail in cases:
        for query in ("", "?dry_run=true"):
            status, problem = await cluster.post(
                "nlp", {"name": "next", "gpus": 8, "command": ["x"], "depends_on": depends_on}, query
            )
            assert status == 422 and problem["field"] == "depends_on[0].job_id", problem
            assert problem["detail"] == detail
    assert await cluster.log.last_seq() == before  # nothing appended

    status, problem = await cluster.post(
        "nlp",
        {"name": "next", "gpus": 8, "command": ["x"], "depends_on": [{"kind": "soon", "job_id": failed}]},
    )
    assert status == 422 and problem["field"] == "depends_on[0].kind", problem
    # an admin may chain teams' jobs, and after-not-ok on a failed job is met at once
    ok = await cluster.submit("admin", "after", team="nlp", depends_on=_after("after-any", theirs))
    met = await cluster.submit("nlp", "cleanup", depends_on=_after("after-not-ok", failed))
    await _cycle(cluster.log, cluster.loop)
    assert cluster.loop.state.jobs[met].state == "bound"
    assert cluster.loop.state.jobs[ok].state == "pending"


async def test_an_array_is_its_members_at_most_its_limit_at_once(cluster: Cluster) -> None:
    status, accepted = await cluster.post(
        "nlp", {"name": "sweep", "gpus": 1, "command": ["x"], "array": "0-4%2"}
    )
    assert status == 202, accepted
    array_id, ids = accepted["array_id"], accepted["job_ids"]
    assert ids == [f"{array_id}_{i}" for i in range(5)] and accepted["job_id"] == ids[0]
    again = await cluster.client.post(
        "/v1/jobs",
        json={"name": "sweep", "gpus": 1, "command": ["x"], "array": "0-4%2"},
        headers={"Authorization": f"Bearer {cluster.tokens['nlp']}", "Idempotency-Key": "k1"},
    )
    assert again.status == 202  # another array (no key before): ids of its own
    keyed = (await again.json())["array_id"]
    assert keyed != array_id
    retry = await cluster.client.post(
        "/v1/jobs",
        json={"name": "sweep", "gpus": 1, "command": ["x"], "array": "0-4%2"},
        headers={"Authorization": f"Bearer {cluster.tokens['nlp']}", "Idempotency-Key": "k1"},
    )
    assert retry.status == 202 and retry.headers.get("Idempotent-Replayed") == "true"
    assert (await retry.json())["array_id"] == keyed  # the same array, not a third
    await cluster.client.delete(
        f"/v1/jobs/{keyed}", headers={"Authorization": f"Bearer {cluster.tokens['nlp']}"}
    )

    await _cycle(cluster.log, cluster.loop)
    bound = [i for i in ids if cluster.loop.state.jobs[i].state == "bound"]
    assert bound == ids[:2]  # 16 free GPUs, but at most 2 of the array at once, in index order
    view = await cluster.view("nlp", ids[2])
    assert view["array"] == {"array_id": array_id, "index": 2, "count": 5, "max_running": 2}
    assert "array" not in view["spec"]
    assert view["pending_reason"]["code"] == "ArrayLimit"
    assert view["pending_reason"]["message"] == "array limit: 2 of its 2 members at once hold GPUs"
    listed = await cluster.client.get(
        f"/v1/jobs?array={array_id}", headers={"Authorization": f"Bearer {cluster.tokens['nlp']}"}
    )
    assert [j["job_id"] for j in (await listed.json())["jobs"]] == ids

    await cluster.run_to_end(ids[0], ok=True)
    await _cycle(cluster.log, cluster.loop)
    assert (
        cluster.loop.state.jobs[ids[2]].state == "bound"
        and cluster.loop.state.jobs[ids[3]].state == "pending"
    )

    # the whole array is cancelled by its id; a member of another team's array is not this team's to cancel
    assert (
        await cluster.client.delete(
            f"/v1/jobs/{array_id}", headers={"Authorization": f"Bearer {cluster.tokens['vision']}"}
        )
    ).status == 404
    cancel = await cluster.client.delete(
        f"/v1/jobs/{array_id}", headers={"Authorization": f"Bearer {cluster.tokens['nlp']}"}
    )
    body = await cancel.json()
    assert cancel.status == 202 and body["job_ids"] == ids[1:], body
    await cluster.loop.follower.wait_for(await cluster.log.last_seq())
    assert all(cluster.loop.state.jobs[i].cancel_requested for i in ids[1:])


async def test_a_bad_array_is_refused_naming_it(cluster: Cluster) -> None:
    before = await cluster.log.last_seq()
    for text, detail in (("0-5000", "at most 1000 members"), ("0-3%0", "whole number >= 1")):
        status, problem = await cluster.post("nlp", {"name": "s", "gpus": 1, "command": ["x"], "array": text})
        assert status == 422 and problem["field"] == "array" and detail in problem["detail"], problem
    status, problem = await cluster.post(
        "nlp", {"name": "s", "gpus": 1, "command": ["x"], "array": "0-3", "secrets": {"TOKEN": "v"}}
    )
    assert status == 422 and problem["field"] == "secrets", problem
    assert await cluster.log.last_seq() == before


async def test_a_dependency_on_a_whole_array_waits_for_every_member(cluster: Cluster) -> None:
    status, accepted = await cluster.post(
        "nlp", {"name": "shard", "gpus": 1, "command": ["x"], "array": "0-2"}
    )
    assert status == 202, accepted
    array_id, ids = accepted["array_id"], accepted["job_ids"]
    merge = await cluster.submit("nlp", "merge", depends_on=_after("after-ok", array_id))
    view = await cluster.view("nlp", merge)
    assert view["depends_on"] == [{"kind": "after-ok", "job_id": i} for i in ids]  # one per member
    # another team does not see the array: its id is refused as a missing job
    status, refused = await cluster.post(
        "vision", {"name": "peek", "gpus": 1, "command": ["x"], "depends_on": _after("after-ok", array_id)}
    )
    assert status == 422 and refused["field"] == "depends_on[0].job_id", refused
    await _cycle(cluster.log, cluster.loop)
    for member in ids[:2]:
        await cluster.run_to_end(member, ok=True)
    await _cycle(cluster.log, cluster.loop)
    assert cluster.loop.state.jobs[merge].state == "pending"  # one member still runs
    await cluster.run_to_end(ids[2], ok=True)
    await _cycle(cluster.log, cluster.loop)
    assert cluster.loop.state.jobs[merge].state == "bound"
