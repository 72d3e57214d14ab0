"""Dry runs of a submission on a real API over a real NATS JetStream (issue 33, Build item 3).

``POST /v1/jobs?dry_run=true`` answers what a submit would meet and appends nothing: the stream's last
sequence is checked around every dry run. On a free cluster it names the queue, its quota and the GPUs the
next cycle would bind; on a full one the core's pending reason and what would let the job start; bad input
gets the very problem a submit gets; a refusal of admission (a priority class the team is not granted, a
fair-use limit) is ``would_admit: false``, and dry runs take nothing of the team's fair-use budget nor
leave an idempotency record. ``rally submit --dry-run`` against the same API exits 0, 1 or 2.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.openapi import openapi_document
from test_api_auth import (  # this folder is on sys.path (rootdir-relative imports)
    PROBLEM,
    Client,
    Tokens,
    register_nodes,
    spec,
    submit,
    submit_ok,
    tokens,  # noqa: F401 (a fixture, used by name)
)

from rallypoint.cli.jobs_cmds import EXIT_ERROR, EXIT_OK, EXIT_WOULD_REFUSE
from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog
from rallypoint.events import GangBound, LeaderEpochStarted, TaskPlacement, subjects
from rallypoint.jobs import job_id_for
from rallypoint.scheduling.queues import Queues, Team
from rallypoint.security.tokens import TokenStore

#: nlp: 16 GPUs of quota, classes up to training-standard. vision: a burst of 2 submissions, then one a
#: minute, so no token comes back while a test runs.
QUEUES = Queues(
    teams=[
        Team(name="nlp", nominal=16, max_priority="training-standard"),
        Team(name="vision", nominal=16, submissions_per_minute=1, submission_burst=2),
    ]
)


@pytest.fixture
async def client(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)  # two nodes of 8 H100s: n0, n1
    app = build_app(
        event_log, config=ApiConfig(source="test-api", queues=QUEUES), auth=TokenStore(tokens.path)
    )
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def dry_run(
    client: Client, log: EventLog, token: str, body: Any, *, key: str | None = None, **headers: str
) -> Any:
    """POST the dry run and check that the log did not grow."""
    before = await log.last_seq()
    extra = {"Idempotency-Key": key} if key else {}
    resp = await client.post(
        "/v1/jobs",
        params={"dry_run": "true"},
        data=body if isinstance(body, str | bytes) else client.session.json_serialize(body),
        headers=Tokens.auth(token) | {"Content-Type": "application/json"} | extra | headers,
    )
    assert await log.last_seq() == before, "a dry run appended to the log"
    return resp


async def answer(resp: Any) -> dict[str, Any]:
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    # no predictor runs beside this API: a waiting job's start is said to be unknown, a placed one's is now
    start = body["predicted_start"]
    assert start is None or start["status"] in {"now", "unavailable"}, start
    if body["placement"] is not None:
        assert start == {"status": "now", "detail": "placed at the next cycle"}
    return body


async def test_a_free_cluster_places_the_job_and_nothing_is_appended(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    seq = await event_log.last_seq()
    body = await answer(await dry_run(client, event_log, tokens.nlp, spec(gpus=8), key="k-1"))
    assert body["would_admit"] is True and body["reason"] is None and body["explanation"] is None
    assert body["job_id"] == job_id_for("nlp", "k-1") and body["log_position"] == seq
    assert body["queue"] == "nlp"
    quota = body["quota"]
    assert (quota["queue"], quota["gpu_type"], quota["nominal"], quota["used"]) == ("nlp", "H100", 16, 0)
    placement = body["placement"]
    assert placement["gpus"] == 8 and placement["gpu_type"] == "H100" and len(placement["nodes"]) == 1
    [task] = placement["tasks"]
    assert task["node_id"] == placement["nodes"][0] in ("n0", "n1") and task["gpus"] == list(range(8))
    # no idempotency record: the same key with another spec is a new job for a submit, not a 422
    assert await submit_ok(client, tokens.nlp, spec(gpus=4), key="k-1") == job_id_for("nlp", "k-1")
    # and a dry run of the job its key made names it; of another spec, the submit's 422
    again = await answer(await dry_run(client, event_log, tokens.nlp, spec(gpus=4), key="k-1"))
    assert again["reason"]["code"] == "AlreadySubmitted" and again["job_id"] == job_id_for("nlp", "k-1")
    reused = await dry_run(client, event_log, tokens.nlp, spec(gpus=8), key="k-1")
    submitted = await submit(client, tokens.nlp, spec(gpus=8), key="k-1")
    assert reused.status == submitted.status == 422
    assert (await reused.json())["field"] == (await submitted.json())["field"] == "idempotency_key"


async def test_a_full_cluster_gives_the_pending_reason(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    job_id = await submit_ok(client, tokens.admin, spec(gpus=16, team="vision"))
    # the 16-GPU job waits ahead of it: the next cycle would bind that one on both nodes first
    ahead = await answer(await dry_run(client, event_log, tokens.nlp, spec(gpus=8)))
    assert ahead["would_admit"] is True and ahead["placement"] is None
    assert ahead["reason"]["code"] == "Resources" and "0 free" in ahead["reason"]["message"]
    assert ahead["explanation"]["gpus"][0]["free"] == 16  # free now; the cycle gives them to the other
    placements = tuple(TaskPlacement(task=i, node_id=f"n{i}", gpus=tuple(range(8))) for i in range(2))
    await event_log.append(
        subjects.EPOCH, LeaderEpochStarted(epoch=1, leader_id="s", at=1.0), msg_id="epoch:1", source="test"
    )
    bound = GangBound(
        job_id=job_id, attempt=1, epoch=1, placements=placements, computed_at_seq=5,
        policy_version="test", now=2.0, at=2.0,
    )  # fmt: skip
    await event_log.append(subjects.bind(job_id), bound, msg_id=f"{job_id}:1:GangBound", source="test")
    # the model under the snapshot follows the fold: the bind took every GPU
    body = await answer(await dry_run(client, event_log, tokens.nlp, spec(gpus=8)))
    assert body["would_admit"] is True and body["placement"] is None and body["job_id"] is None
    assert body["reason"]["code"] == "Resources" and "free" in body["reason"]["message"]
    assert body["log_position"] == await event_log.last_seq()
    [gpus] = body["explanation"]["gpus"]
    assert (gpus["gpu_type"], gpus["free"], gpus["short"]) == ("H100", 0, 8)
    assert body["explanation"]["would_start"]
    assert body["quota"]["room"] == 16  # the quota admits it: the GPUs are what it lacks


@pytest.mark.parametrize(
    ("body", "content_type", "token"),
    [
        (spec(gpus=0), "application/json", "nlp"),  # invalid spec: 422 naming gpus
        (spec(gpus=64), "application/json", "nlp"),  # larger than the cluster: 422
        ("{not json", "application/json", "nlp"),  # 400
        (spec(), "text/plain", "nlp"),  # 415
        (spec(team="vision"), "application/json", "nlp"),  # another team's: 403 naming team
    ],
)
async def test_bad_input_gets_the_problem_a_submit_gets(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    body: Any,
    content_type: str,
    token: str,
) -> None:
    key = getattr(tokens, token)
    dry = await dry_run(client, event_log, key, body, **{"Content-Type": content_type})
    raw = body if isinstance(body, str) else client.session.json_serialize(body)
    real = await client.post("/v1/jobs", data=raw, headers=Tokens.auth(key) | {"Content-Type": content_type})
    assert 400 <= dry.status < 500 and dry.status == real.status
    assert dry.content_type == real.content_type == PROBLEM
    dry_body, real_body = await dry.json(), await real.json()
    assert (dry_body.get("field"), dry_body["detail"]) == (real_body.get("field"), real_body["detail"])


async def test_a_bad_dry_run_flag_is_400_naming_it(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    before = await event_log.last_seq()
    resp = await client.post(
        "/v1/jobs", params={"dry_run": "maybe"}, json=spec(), headers=Tokens.auth(tokens.nlp)
    )
    assert resp.status == 400 and (await resp.json())["field"] == "dry_run"
    assert await event_log.last_seq() == before


async def test_refusals_of_admission_are_answers_and_take_no_budget(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    vision = spec(team="vision", gpus=1)
    for _ in range(5):  # more dry runs than the burst: none takes a token
        body = await answer(await dry_run(client, event_log, tokens.vision, vision))
        assert body["would_admit"] is True and body["placement"]["gpus"] == 1
    await submit_ok(client, tokens.vision, vision)
    await submit_ok(client, tokens.vision, vision)  # the whole burst was still there
    body = await answer(await dry_run(client, event_log, tokens.vision, vision))
    assert body["would_admit"] is False and body["placement"] is None
    assert body["reason"]["code"] == "FairUse" and body["reason"]["limit"] == "submissions_per_minute"
    assert (await submit(client, tokens.vision, vision)).status == 429  # as the dry run said
    # a class above the team's ceiling: refused with the field named, as a submit's 403 names it
    body = await answer(await dry_run(client, event_log, tokens.nlp, spec(priority="production")))
    assert body["would_admit"] is False and body["reason"]["field"] == "priority"
    assert (await submit(client, tokens.nlp, spec(priority="production"))).status == 403
    # a GPU type no node has: the scheduler would reject it
    body = await answer(await dry_run(client, event_log, tokens.nlp, spec(gpu_type="A100")))
    assert body["would_admit"] is False and body["reason"]["code"] == "GangTooLarge"


def test_the_openapi_document_names_the_flag_and_the_answer() -> None:
    post = openapi_document(("training-standard",), "training-standard", None)["paths"]["/v1/jobs"]["post"]
    [flag] = [p for p in post["parameters"] if p["name"] == "dry_run"]
    assert flag["in"] == "query" and flag["schema"]["type"] == "boolean"
    assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/DryRun")


async def test_rally_submit_dry_run_against_the_live_api(
    client: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI blocks, so it runs in a thread while the loop serves; exit 0 / 1 / 2, nothing appended."""
    monkeypatch.setenv("RALLY_TOKEN", tokens.nlp)
    monkeypatch.delenv("RALLY_TEAM", raising=False)
    url = str(client.make_url("")).rstrip("/")
    before = await event_log.last_seq()

    async def dry(*flags: str) -> int:
        argv = ["submit", "--dry-run", "--api-url", url, *flags, "--", "python", "train.py"]
        code: int = await asyncio.to_thread(rally, argv)
        return code

    assert await dry("--gpus", "8") == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Would be admitted to queue nlp"
    assert lines[1].startswith("Placement: 8 H100 GPUs on n")
    assert await dry("--gpus", "8", "--priority", "production") == EXIT_WOULD_REFUSE
    assert capsys.readouterr().out.startswith("Would be refused: PriorityNotAllowed (--priority): ")
    assert await dry("--gpus", "64") == EXIT_ERROR
    assert capsys.readouterr().err.startswith("error: --gpus: ")
    assert await event_log.last_seq() == before
