"""No input stops a reader (issue 30): every string of every endpoint is clean, live over a real NATS.

Before: ``POST /v1/jobs`` with a NUL in ``gpu_type`` answered 202 and the PostgreSQL projector then
crash-looped on the event forever; invalid UTF-8 inside a JSON string answered 500; ``checkpoint_dir``
``/etc`` or ``../../..`` was accepted. Now each is a 4xx problem+json naming the field, and nothing is
appended to the log: every refusal here checks the stream's last sequence did not move.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import test_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rallypoint_services.api import ApiConfig, build_app
from test_api_auth import Client, Tokens, assert_problem, register_nodes, tokens  # noqa: F401

from rallypoint.eventlog import EventLog
from rallypoint.security.tokens import TokenStore

ROOT = "/shared/checkpoints"
#: every string a submission carries: (field the refusal names, free text?, the fields with ``c`` in it)
SPEC_STRINGS: list[tuple[str, bool, Callable[[str], dict[str, Any]]]] = [
    ("name", False, lambda c: {"name": f"pre{c}train"}),
    ("team", False, lambda c: {"team": f"nlp{c}"}),
    ("priority", False, lambda c: {"priority": f"{c}development"}),
    ("gpu_type", False, lambda c: {"gpu_type": f"H100{c}"}),
    ("gpu_types[0]", False, lambda c: {"gpu_types": [f"A{c}100", "H100"]}),
    ("gpu_types[1]", False, lambda c: {"gpu_types": ["A100", f"H100{c}"]}),
    ("topology_required", False, lambda c: {"topology_required": f"rack{c}"}),
    ("topology_preferred", False, lambda c: {"topology_preferred": f"node{c}"}),
    ("checkpoint_dir", False, lambda c: {"checkpoint_dir": f"{ROOT}/nlp/run{c}"}),
    ("command[0]", True, lambda c: {"command": [f"python{c}", "train.py"]}),
    ("command[2]", True, lambda c: {"command": ["python", "train.py", f"--lr={c}"]}),
    ("env.WANDB_API_KEY", True, lambda c: {"env": {"WANDB_API_KEY": f"k{c}y"}}),
    ("env", False, lambda c: {"env": {f"NCCL{c}": "1"}}),
    ("body", False, lambda c: {f"labels{c}": "x"}),
]
#: refused everywhere: controls (C0 but tab and newline, DEL, C1), lone surrogates, bidi formatting
ALWAYS_REFUSED = st.sampled_from(["\x00", "\x1b", "\r", "\x7f", "\x85", "\ud800", "\udcff", "\u202e"]) | (
    st.characters(categories=["Cc", "Cs"]).filter(lambda c: c not in "\t\n")
)


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "pretrain", "team": "nlp", "gpus": 8, "command": ["python", "train.py"]}
    body.update(overrides)
    return body


@pytest.fixture
async def api(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)  # n0, n1
    config = ApiConfig(source="test-api", checkpoint_root=ROOT)
    app = build_app(event_log, config=config, auth=TokenStore(tokens.path))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def post_json(api: Client, token: str, raw: bytes, path: str = "/v1/jobs", **headers: str) -> Any:
    headers = {"Content-Type": "application/json", **Tokens.auth(token), **headers}
    return await api.post(path, data=raw, headers=headers)


def encoded(body: object) -> bytes:
    """JSON as a client sends it: a lone surrogate travels as a \\u escape (what JSON.stringify does)."""
    return json.dumps(body).encode()


async def refused(resp: Any, status: int, field: str) -> dict[str, Any]:
    body = await assert_problem(resp, status, field)
    assert body["invalid_params"] == [{"name": field, "reason": body["detail"]}]
    return body


# --- POST /v1/jobs: every string field (a property test) --------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(SPEC_STRINGS), char=ALWAYS_REFUSED | st.sampled_from(["\t", "\n"]))
async def test_every_string_of_a_submission_is_refused_naming_it(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    case: tuple[str, bool, Callable[[str], dict[str, Any]]],
    char: str,
) -> None:
    field, free_text, overrides = case
    body = spec(**overrides(char))
    before = await event_log.last_seq()
    resp = await post_json(api, tokens.admin, encoded(body))
    if free_text and char in "\t\n":
        assert resp.status == 202, await resp.text()  # a script's newline, a PEM value: accepted
        return
    # a lone surrogate is not UTF-8: the body cannot be read (400); any other character is refused (422)
    status = 400 if "\ud800" <= char <= "\udfff" else 422
    await refused(resp, status, field)
    assert await event_log.last_seq() == before


async def test_the_nul_of_the_issue_is_refused(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    """The three fields the issue found: each once with the NUL the projector could not store."""
    before = await event_log.last_seq()
    for field, value in [("gpu_type", "H1\x0000"), ("checkpoint_dir", f"{ROOT}/nlp/\x00")]:
        resp = await post_json(api, tokens.nlp, encoded(spec(**{field: value})))
        body = await refused(resp, 422, field)
        assert "NUL" in body["detail"]
    resp = await post_json(api, tokens.nlp, encoded(spec(gpu_types=["H100", "A1\x0000"])))
    await refused(resp, 422, "gpu_types[1]")
    assert await event_log.last_seq() == before


# --- invalid UTF-8 in a body: 400 naming the field, never 500 ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"name": "x", "gpus": 8, "command": ["python", "\xff"]}', "command[1]"),
        (b'{"name": "x", "gpus": 8, "command": ["python"], "gpu_type": "H\xc3"}', "gpu_type"),
        (b'{"name": "x", "gpus": 8, "command": ["python"], "env": {"A": "\xed\xa0\x80"}}', "env.A"),
        (b'{"name": "x", "gpus": 8, "command": ["python"], "gpu\xfftype": "H100"}', "body"),
        (b'\xff\xfe{"name": "x"}', "body"),
    ],
)
async def test_invalid_utf8_is_a_400_naming_the_field(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    raw: bytes,
    field: str,
) -> None:
    before = await event_log.last_seq()
    await refused(await post_json(api, tokens.nlp, raw), 400, field)
    assert await event_log.last_seq() == before


# --- CloudEvents: the attributes too -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        ({"source": "ci/\x1b[2J"}, "source"),
        ({"type": "io.rallypoint.job.submit\n"}, "type"),
        ({"subject": "x\x00"}, "subject"),  # an extension attribute: not read, still not stored unclean
        ({"id": "build-17\n"}, "id"),
        ({"data": spec(name="a\x00")}, "name"),
    ],
)
async def test_cloudevent_attributes_are_clean(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    envelope: dict[str, Any],
    field: str,
) -> None:
    event = {"specversion": "1.0", "id": "e-1", "source": "ci", "type": "submit", "data": spec(), **envelope}
    before = await event_log.last_seq()
    headers = {"Content-Type": "application/cloudevents+json", **Tokens.auth(tokens.nlp)}
    await refused(await api.post("/v1/jobs", data=encoded(event), headers=headers), 422, field)
    assert await event_log.last_seq() == before


# --- checkpoint_dir: absolute, normalized, in the team's folder of the cluster's root ----------------------


@pytest.mark.parametrize(
    "path",
    ["/etc", "../../..", "ckpt", f"{ROOT}/nlp/../../../etc", f"{ROOT}/vision/run", f"{ROOT}/j-0123456789ab"],
)
async def test_checkpoint_dir_outside_the_teams_folder_is_refused(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    path: str,
) -> None:
    before = await event_log.last_seq()
    resp = await post_json(api, tokens.nlp, encoded(spec(checkpoint_dir=path)))
    await refused(resp, 422, "checkpoint_dir")
    assert await event_log.last_seq() == before


async def test_checkpoint_dir_in_the_teams_folder_is_accepted(api: Client, tokens: Tokens) -> None:  # noqa: F811
    resp = await post_json(api, tokens.nlp, encoded(spec(checkpoint_dir=f"{ROOT}/nlp/llama/run-1")))
    assert resp.status == 202, await resp.text()
    job = await (
        await api.get(f"/v1/jobs/{(await resp.json())['job_id']}", headers=Tokens.auth(tokens.nlp))
    ).json()
    assert job["spec"]["checkpoint_dir"] == f"{ROOT}/nlp/llama/run-1"


async def test_no_checkpoint_root_refuses_every_checkpoint_dir(event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    await register_nodes(event_log)
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tokens.path))
    async with test_utils.TestClient(test_utils.TestServer(app)) as api:
        before = await event_log.last_seq()
        resp = await post_json(api, tokens.nlp, encoded(spec(checkpoint_dir=f"{ROOT}/nlp/run")))
        body = await refused(resp, 422, "checkpoint_dir")
        assert "no checkpoint root" in body["detail"]
        assert await event_log.last_seq() == before


# --- node drain and undrain: the reason is free text, the rest of the body one line -----------------------


@pytest.mark.parametrize("action", ["drain", "undrain"])
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"reason": "bad DIMM\x00"}, 422, "reason"),
        ({"reason": "bad \x1b[31mDIMM"}, 422, "reason"),
        ({"reason": "bad \u202eMMID"}, 422, "reason"),
        ({"reason": "bad DIMM", "ticket": "OPS-1\n"}, 422, "ticket"),
        ({"reason": "bad DIMM", "ticket": "OPS-1"}, 422, "ticket"),  # a reason only: nothing unread
        ({"reason": "bad DIMM", "tic\x00ket": 1}, 422, "body"),
        (b'{"reason": "bad \xff DIMM"}', 400, "reason"),
        (b'{"reason": "bad \\udc00 DIMM"}', 400, "reason"),
    ],
)
async def test_node_reasons_are_clean(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    action: str,
    body: object,
    status: int,
    field: str,
) -> None:
    raw = body if isinstance(body, bytes) else encoded(body)
    before = await event_log.last_seq()
    resp = await post_json(api, tokens.admin, raw, f"/v1/nodes/n0/{action}")
    await refused(resp, status, field)
    assert await event_log.last_seq() == before


async def test_a_reason_may_span_lines(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    raw = encoded({"reason": "bad DIMM\n\tslot 3, ticket OPS-1"})
    resp = await post_json(api, tokens.admin, raw, "/v1/nodes/n0/drain")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["node"]["status_reason"] == "bad DIMM\n\tslot 3, ticket OPS-1"


# --- query and path parameters, on every route ------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("GET", "/v1/jobs?team=nlp%00", "team"),
        ("GET", "/v1/jobs?team=%FF", "team"),  # not UTF-8: aiohttp alone would make it U+FFFD
        ("GET", "/v1/jobs?state=pending%0A", "state"),
        ("GET", "/v1/jobs?te%1Bam=nlp", "query"),
        ("GET", "/v1/history?team=%E2%80%AEnlp", "team"),
        ("GET", "/v1/usage?by=team&team=%7F", "team"),
        ("GET", "/v1/jobs/j-0123%00", "job_id"),
        ("DELETE", "/v1/jobs/j-0123%0D%0A", "job_id"),
        ("POST", "/v1/nodes/n0%1B/drain", "node_id"),
    ],
)
async def test_query_and_path_parameters_are_clean(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    method: str,
    url: str,
    field: str,
) -> None:
    before = await event_log.last_seq()
    resp = await api.request(method, url, headers=Tokens.auth(tokens.admin), json={"reason": "x"})
    await refused(resp, 400, field)
    assert await event_log.last_seq() == before
