"""A team token sees no other team's job ids or names anywhere (issue 30, Build item 4), live over real NATS.

Two teams share two 8-GPU nodes. The real scheduler (``SchedulerLoop``, in process, on the same log) binds
``vision``'s two jobs, which then run; ``nlp``'s jobs preempt them one after the other, so there are jobs
running on nodes, a pending reason naming another team's victim ("preempting 1 job (j-...)"), a victim
whose ``preempting_for`` and history name the other team's job, and a finished job. Every GET route of
the application's router is then read with each token (and with none): the routes are enumerated from
the aiohttp app itself, so a route added later is read here without anyone remembering to.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils, web
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.dashboard import ASSETS
from rallypoint_services.api.views import OTHER_TEAM_JOB, Audience
from rallypoint_services.scheduler.leader import SchedulerLoop

# the in-process scheduler leader those tests drive, and one cycle of it waited for in the fold
from test_scheduler_cycle_writes import _cycle, _leading

from rallypoint.eventlog import EventLog
from rallypoint.events import (
    Event,
    GpuInfo,
    JobCompleted,
    JobPreempted,
    JobSpec,
    JobStarted,
    NodeRegistered,
    subjects,
)
from rallypoint.security.tokens import TokenStore, create_token
from rallypoint.state import JobView

Client = test_utils.TestClient[web.Request, web.Application]
TEAMS = ("nlp", "vision")
#: An id of the API's shape that no job has: what "no such job" answers look like.
MISSING = "j-000000000000"
_clock = itertools.count(1000)


def _now() -> float:
    return float(next(_clock))


@dataclass
class Job:
    job_id: str
    name: str
    team: str


@dataclass
class Scene:
    app: web.Application
    client: Client
    tokens: dict[str, str]  # "admin", "nlp", "vision" -> bearer token
    jobs: list[Job]
    victims: list[str]  # vision's jobs, in the order nlp's jobs preempted them
    waiting: str  # nlp's job still waiting for its victim to stop

    def headers(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}

    def of(self, team: str) -> list[Job]:
        return [j for j in self.jobs if j.team == team]

    def others(self, team: str | None) -> list[Job]:
        return [j for j in self.jobs if j.team != team]


async def _append(log: EventLog, event: Event, msg_id: str) -> None:
    """An event where its writer stores it (the job controller's, an agent's): what the services do."""
    await log.append(subjects.for_event(event), event, msg_id=msg_id, source="test")


async def _register_nodes(log: EventLog) -> None:
    for i in range(2):
        gpus = tuple(
            GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(8)
        )
        event = NodeRegistered(
            node_id=f"n{i}", address=f"10.0.0.{i}", rack="r0", gpu_type="H100", gpus=gpus, cpu_milli=96000,
            memory_mib=1 << 20, agent_instance="test", at=1.0,
        )  # fmt: skip
        await _append(log, event, f"n{i}:0:NodeRegistered")


def _token_file(path: Path) -> dict[str, str]:
    _, admin = create_token(path, user="root-ops", admin=True)
    _, nlp = create_token(path, user="alice", team="nlp")
    _, vision = create_token(path, user="bob", team="vision")
    return {"admin": admin, "nlp": nlp, "vision": vision}


class _Play:
    """Submits through the API with each team's token and acts as the job controller on the log."""

    def __init__(self, client: Client, tokens: dict[str, str], log: EventLog, loop: SchedulerLoop) -> None:
        self.client, self.tokens, self.log, self.loop = client, tokens, log, loop
        self.jobs: list[Job] = []

    async def submit(self, team: str, name: str, priority: str, gpus: int = 8) -> str:
        body = {"name": name, "gpus": gpus, "priority": priority, "command": ["python", "train.py"]}
        resp = await self.client.post(
            "/v1/jobs", json=body, headers={"Authorization": f"Bearer {self.tokens[team]}"}
        )
        assert resp.status == 202, await resp.text()
        job_id = str((await resp.json())["job_id"])
        self.jobs.append(Job(job_id=job_id, name=name, team=team))
        return job_id

    def view(self, job_id: str) -> JobView:
        return self.loop.state.jobs[job_id]

    async def start(self, job_id: str) -> None:
        attempt = self.view(job_id).attempt
        await _append(
            self.log, JobStarted(job_id=job_id, attempt=attempt, at=_now()), f"{job_id}:{attempt}:start"
        )

    async def preempted(self, victim: str) -> None:
        """The controller carries the scheduler's preemption request out: the victim stopped, waits again."""
        job = self.view(victim)
        assert job.preempt_for is not None, f"{victim} was not asked to stop"
        event = JobPreempted(
            job_id=victim, attempt=job.attempt, for_job=job.preempt_for, reason=job.preempt_reason, at=_now()
        )
        await _append(self.log, event, f"{victim}:{job.attempt}:JobPreempted")

    async def cycle(self) -> None:
        await _cycle(self.log, self.loop)

    def victim_of(self, job_id: str) -> str:
        [victim] = [j.job_id for j in self.loop.state.jobs.values() if j.preempt_for == job_id]
        return victim


async def _play(play: _Play) -> tuple[list[str], str]:
    """vision runs on both nodes; nlp's first job preempts one of them (carried out: it then runs and
    finishes), its second preempts the other (still waiting for it to stop). Returns the victims in order
    and nlp's waiting job."""
    running = [await play.submit("vision", name, "best-effort") for name in ("vision-alpha", "vision-beta")]
    await play.cycle()
    for job_id in running:
        await play.start(job_id)
    first = await play.submit("nlp", "nlp-gamma", "training-high")
    await play.cycle()
    victim = play.victim_of(first)
    await play.preempted(victim)
    await play.cycle()
    assert play.view(first).state == "bound"
    await play.start(first)
    await play.submit("vision", "vision-epsilon", "development", gpus=16)
    second = await play.submit("nlp", "nlp-delta", "training-high")
    await play.cycle()
    assert play.view(second).pending_code == "Preempting", play.view(second)
    await _append(play.log, JobCompleted(job_id=first, attempt=1, at=_now()), f"{first}:1:JobCompleted")
    return [victim, play.victim_of(second)], second


@pytest.fixture
async def scene(event_log: EventLog, tmp_path: Path) -> AsyncIterator[Scene]:
    await _register_nodes(event_log)
    tokens = _token_file(tmp_path / "tokens.json")
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tmp_path / "tokens.json"))
    async with test_utils.TestClient(test_utils.TestServer(app)) as client, _leading(event_log) as loop:
        play = _Play(client, tokens, event_log, loop)
        victims, waiting = await _play(play)
        yield Scene(app=app, client=client, tokens=tokens, jobs=play.jobs, victims=victims, waiting=waiting)


# --- reading every GET route ----------------------------------------------------------------------------


def get_routes(app: web.Application) -> list[str]:
    """Every GET route of the app, by its pattern (``/v1/jobs/{job_id}``)."""
    routes = {
        route.resource.canonical for route in app.router.routes() if route.method == "GET" and route.resource
    }
    return sorted(routes)


def paths(route: str, job_ids: list[str]) -> list[str]:
    """``route`` with each value its parameters can take here; a parameter this test does not know fails
    it, so a new kind of route is looked at before it is trusted."""
    # port: a job's published port (GET /v1/jobs/{job_id}/ports/{port}); none of these jobs publishes one
    values = {"job_id": job_ids, "name": sorted(ASSETS), "port": ["8888"]}
    params = re.findall(r"{(\w+)}", route)
    unknown = [p for p in params if p not in values]
    if unknown:
        pytest.fail(f"GET {route}: this test has no values for {unknown}; add them to paths()")
    filled = [route]
    for param in params:
        filled = [path.replace(f"{{{param}}}", value) for path in filled for value in values[param]]
    return filled


#: Queries beyond each route's defaults that change what a view groups or filters by.
QUERIES = ("/v1/usage?by=user", "/v1/usage?by=class", "/v1/jobs?state=pending", "/v1/jobs?state=running")


async def read_all(scene: Scene, who: str | None, job_ids: list[str]) -> dict[str, tuple[int, str]]:
    """path -> (status, body) for every GET route read with ``who``'s token (None: no token)."""
    answers = {}
    for path in [p for route in get_routes(scene.app) for p in paths(route, job_ids)] + list(QUERIES):
        resp = await scene.client.get(path, headers=scene.headers(who))
        answers[path] = (resp.status, await resp.text())
    return answers


def named(answers: dict[str, tuple[int, str]], jobs: list[Job]) -> list[tuple[str, str]]:
    """(path, id or name) for every job id or name of ``jobs`` found in an answer."""
    return [
        (path, word)
        for path, (_, body) in answers.items()
        for job in jobs
        for word in (job.job_id, job.name)
        if word in body
    ]


@pytest.mark.parametrize("team", TEAMS)
async def test_a_team_token_reads_no_other_teams_job_on_any_get_route(scene: Scene, team: str) -> None:
    own = [j.job_id for j in scene.of(team)]
    answers = await read_all(scene, team, own)
    assert any(path.startswith("/v1/nodes") for path in answers)
    assert named(answers, scene.others(team)) == []
    # and it read its own in full: every own job, by id and name, in its list and on its own route
    for job in scene.of(team):
        assert answers[f"/v1/jobs/{job.job_id}"][0] == 200
        assert job.job_id in answers["/v1/jobs"][1] and job.name in answers["/v1/jobs"][1]


async def test_without_a_token_no_route_names_any_job(scene: Scene) -> None:
    answers = await read_all(scene, None, [j.job_id for j in scene.jobs])
    assert named(answers, scene.jobs) == []
    assert answers["/metrics"][0] == 200 and "rally_jobs" in answers["/metrics"][1]


async def test_the_admin_reads_every_job_through_the_same_routes(scene: Scene) -> None:
    answers = await read_all(scene, "admin", [j.job_id for j in scene.jobs])
    found = {word for _, word in named(answers, scene.jobs)}
    assert found == {w for j in scene.jobs for w in (j.job_id, j.name)}
    waiting = answers[f"/v1/jobs/{scene.waiting}"][1]
    assert scene.victims[1] in waiting  # the pending reason names the victim, unredacted
    nodes = answers["/v1/nodes"][1]
    assert scene.victims[1] in nodes


# --- what a team does see of the others -----------------------------------------------------------------


async def _json(scene: Scene, who: str, path: str) -> Any:
    resp = await scene.client.get(path, headers=scene.headers(who))
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_a_pending_reason_counts_another_teams_victim_without_naming_it(scene: Scene) -> None:
    job = await _json(scene, "nlp", f"/v1/jobs/{scene.waiting}")
    reason = job["pending_reason"]
    assert reason["code"] == "Preempting"
    assert f"preempting 1 job ({OTHER_TEAM_JOB})" in reason["message"], reason
    admin = await _json(scene, "admin", f"/v1/jobs/{scene.waiting}")
    assert admin["pending_reason"]["message"] == reason["message"].replace(OTHER_TEAM_JOB, scene.victims[1])


async def test_a_victim_sees_it_was_preempted_for_another_team_not_for_which_job(scene: Scene) -> None:
    running = await _json(scene, "vision", f"/v1/jobs/{scene.victims[1]}")
    assert running["preempting_for"] == OTHER_TEAM_JOB
    history = await _json(scene, "vision", f"/v1/jobs/{scene.victims[0]}/history")
    assert [p["for_job"] for p in history["preemptions"]] == [OTHER_TEAM_JOB]
    assert history["attempts"][0]["preempted_for"] == OTHER_TEAM_JOB
    admin = await _json(scene, "admin", f"/v1/jobs/{scene.victims[0]}/history")
    assert admin["preemptions"][0]["for_job"] in {j.job_id for j in scene.of("nlp")}


async def test_queues_show_a_team_its_own_users_and_of_the_others_only_counts(scene: Scene) -> None:
    def users(report: Any) -> dict[str, list[str]]:
        return {t["team"]: [u["user"] for u in t["users"]] for t in report["teams"]}

    # each job carries its token's user (JobSubmitted.submitted_by): fair share between a team's users
    admin = await _json(scene, "admin", "/v1/queues")
    assert users(admin) == {"nlp": ["alice"], "vision": ["bob"]}
    nlp = await _json(scene, "nlp", "/v1/queues")
    assert users(nlp) == {"nlp": ["alice"], "vision": []}
    assert [t["running_jobs"] for t in nlp["teams"]] == [t["running_jobs"] for t in admin["teams"]]


async def test_nodes_show_another_teams_gpus_busy_without_its_jobs(scene: Scene) -> None:
    nodes = {n["node_id"]: n for n in (await _json(scene, "nlp", "/v1/nodes"))["nodes"]}
    admin = {n["node_id"]: n for n in (await _json(scene, "admin", "/v1/nodes"))["nodes"]}
    nlp_ids = {j.job_id for j in scene.of("nlp")}
    for node_id, seen in nodes.items():
        # another team's GPUs still count as allocated, and which they are (the dashboard draws them busy)
        assert seen["gpus"] == admin[node_id]["gpus"]
        assert seen["busy_gpus"] == admin[node_id]["busy_gpus"]
        assert seen["jobs"] == [j for j in admin[node_id]["jobs"] if j in nlp_ids]
    assert sum(n["gpus"]["allocated"] for n in nodes.values()) == 8  # vision's running job, unnamed
    assert sorted(len(n["busy_gpus"]) for n in nodes.values()) == [0, 8]
    assert all(n["jobs"] == [] for n in nodes.values())


@pytest.mark.parametrize("team", TEAMS)
async def test_another_teams_job_is_answered_as_a_missing_one(scene: Scene, team: str) -> None:
    """The same 404 as for an id no job has, on every route that takes a job id, DELETE included: a
    team token cannot even tell that another team's job exists."""
    routes = [r for r in get_routes(scene.app) if "{job_id}" in r]
    assert len(routes) >= 4
    for other in scene.others(team):
        for route in routes:
            answers = []
            for job_id in (other.job_id, MISSING):
                resp = await scene.client.get(route.replace("{job_id}", job_id), headers=scene.headers(team))
                answers.append((resp.status, (await resp.text()).replace(job_id, "<id>")))
            assert answers[0] == answers[1], (route, answers)
            assert answers[0][0] == 404
        gone = await scene.client.delete(f"/v1/jobs/{other.job_id}", headers=scene.headers(team))
        missing = await scene.client.delete(f"/v1/jobs/{MISSING}", headers=scene.headers(team))
        assert gone.status == missing.status == 404
        assert (await gone.text()).replace(other.job_id, "<id>") == (await missing.text()).replace(
            MISSING, "<id>"
        )


# --- the redaction itself -------------------------------------------------------------------------------


def _job(job_id: str, team: str) -> JobView:
    spec = JobSpec(name=job_id, team=team, gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))
    return JobView(job_id=job_id, spec=spec, submitted_at=0.0, submitted_seq=1)


def test_text_hides_other_teams_and_unknown_job_ids_and_keeps_the_rest() -> None:
    jobs = {
        j.job_id: j
        for j in (_job("j-aaaaaaaaaaaa", "nlp"), _job("j-bbbbbbbbbbbb", "vision"), _job("old-7", "vision"))
    }
    nlp = Audience("nlp", jobs)
    message = (
        "waits behind head-of-line job j-bbbbbbbbbbbb; "
        "preempting 3 jobs (j-aaaaaaaaaaaa, old-7, j-cccccccccccc)"
    )
    assert nlp.text(message) == (
        f"waits behind head-of-line {OTHER_TEAM_JOB}; preempting 3 jobs "
        f"(j-aaaaaaaaaaaa, {OTHER_TEAM_JOB}, {OTHER_TEAM_JOB})"
    )
    assert (
        nlp.text("needs 16 GPUs in one rack; 8 free; 2 jobs ahead")
        == "needs 16 GPUs in one rack; 8 free; 2 jobs ahead"
    )
    assert Audience(None, jobs).text(message) == message
    assert nlp.scrub({"spec": {"env": {"X": "j-bbbbbbbbbbbb"}}, "for": ["j-bbbbbbbbbbbb", 3]}) == {
        "spec": {"env": {"X": "j-bbbbbbbbbbbb"}},
        "for": [OTHER_TEAM_JOB, 3],
    }
