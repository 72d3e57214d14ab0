"""Operator drain and undrain (issue 16 item 3), live: the API with token auth over a real NATS JetStream.

An admin drains a node (the fold shows it drained with the reason, and it is no longer schedulable) and
undrains it (up again); a team token gets 403 and nothing is appended; an unknown node is 404, a blank
reason 422; a lost node cannot be undrained (409); `rally nodes drain|undrain` prints what happened and
exits non-zero on a refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.app import FOLLOWER
from test_api_auth import Client, Tokens, assert_problem, events_of, register_nodes, tokens  # noqa: F401

from rallypoint.cli.main import main as rally
from rallypoint.eventlog import EventLog
from rallypoint.events import NodeDrained, NodeHeartbeatLost, NodeLost, NodeUndrained, subjects
from rallypoint.security.tokens import TokenStore


@pytest.fixture
async def api(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)  # n0, n1
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tokens.path))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def _post(api: Client, token: str, node: str, action: str, reason: object = "bad DIMM") -> Any:
    return await api.post(f"/v1/nodes/{node}/{action}", json={"reason": reason}, headers=Tokens.auth(token))


async def _status(api: Client, token: str, node: str) -> dict[str, object]:
    resp = await api.get("/v1/nodes", headers=Tokens.auth(token))
    nodes = {n["node_id"]: n for n in (await resp.json())["nodes"]}
    return dict(nodes[node])


async def test_admin_drains_and_undrains(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    resp = await _post(api, tokens.admin, "n0", "drain", "replacing GPU 3")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["action"] == "drain"
    assert body["node"]["status"] == "drained" and body["node"]["status_reason"] == "replacing GPU 3"
    assert body["node"]["gpus"]["free"] == 0  # not schedulable: the scheduler places nothing on it
    fold = api.app[FOLLOWER].state.nodes["n0"]
    assert fold.status == "drained" and not fold.schedulable and fold.status_reason == "replacing GPU 3"
    (drained,) = await events_of(event_log, NodeDrained)
    assert drained.drained_by == "root-ops" and drained.reason == "replacing GPU 3"

    resp = await _post(api, tokens.admin, "n0", "undrain", "GPU replaced")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["node"]["status"] == "up"
    assert (await _status(api, tokens.admin, "n0"))["status"] == "up"
    (undrained,) = await events_of(event_log, NodeUndrained)
    assert undrained.undrained_by == "root-ops" and undrained.reason == "GPU replaced"

    # undrain of a node that is up: nothing to undo, nothing appended
    resp = await _post(api, tokens.admin, "n0", "undrain")
    assert resp.status == 200 and (await resp.json())["changed"] is False
    assert len(await events_of(event_log, NodeUndrained)) == 1


async def test_team_token_is_refused(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    for action in ("drain", "undrain"):
        await assert_problem(await _post(api, tokens.nlp, "n0", action), 403, None)
    assert await events_of(event_log, NodeDrained) == []
    assert (await _status(api, tokens.admin, "n0"))["status"] == "up"


async def test_unknown_node_and_blank_reason(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    await assert_problem(await _post(api, tokens.admin, "n9", "drain"), 404, None)
    body = await assert_problem(await _post(api, tokens.admin, "n0", "drain", "  "), 422, "reason")
    assert "reason" in body["detail"]
    await assert_problem(await _post(api, tokens.admin, "n0", "drain", None), 422, "reason")
    assert await events_of(event_log, NodeDrained) == []


async def _lose(log: EventLog, node: str) -> None:
    await log.append(
        subjects.node_health(node),
        NodeHeartbeatLost(node_id=node, last_seen=1.0, at=2.0),
        msg_id="hb",
        source="t",
    )
    lost = NodeLost(node_id=node, reason="no heartbeat for 31 s", at=3.0)
    await log.append(subjects.node_health(node), lost, msg_id="lost", source="t")


async def test_undrain_of_a_lost_node_is_409(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    await _lose(event_log, "n1")
    body = await assert_problem(await _post(api, tokens.admin, "n1", "undrain"), 409, None)
    assert body["status"] == 409 and "lost" in body["detail"]
    await assert_problem(await _post(api, tokens.admin, "n1", "drain"), 409, None)
    assert await events_of(event_log, NodeUndrained) == []
    assert (await _status(api, tokens.admin, "n1"))["status"] == "lost"


async def test_drain_fenced_on_the_node_subject(api: Client, event_log: EventLog, tokens: Tokens) -> None:  # noqa: F811
    """The append carries the node subject's last sequence: a verdict appended since conflicts, and the
    request is decided again on the newer view (here: the node is lost, so the drain is refused)."""
    handlers = api.server.app.router  # the route's NodeOps instance
    ops = next(r.handler for r in handlers.routes() if r.resource and r.resource.canonical.endswith("/drain"))
    node_ops = ops.__self__
    log = node_ops.log
    real_append, real_last_seq = log.append, log.last_seq
    reads = 0

    async def counted_last_seq(subject: str | None = None) -> int:
        nonlocal reads
        reads += 1
        return int(await real_last_seq(subject))

    async def verdict_first(*args: Any, **kwargs: Any) -> int:
        log.append = real_append  # once
        await _lose(event_log, "n0")  # the health verdict lands after the API decided, before its append
        return int(await real_append(*args, **kwargs))

    log.append, log.last_seq = verdict_first, counted_last_seq
    try:
        body = await assert_problem(await _post(api, tokens.admin, "n0", "drain"), 409, None)
    finally:
        log.append, log.last_seq = real_append, real_last_seq
    assert "lost" in body["detail"]
    assert reads == 2  # the conflict made it read again and decide on the newer view
    assert await events_of(event_log, NodeDrained) == []


async def test_cli_drain_and_refusal(
    api: Client,
    tokens: Tokens,  # noqa: F811
    event_log: EventLog,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = str(api.make_url("")).rstrip("/")
    monkeypatch.setenv("RALLY_TOKEN", tokens.admin)
    code = await asyncio.to_thread(rally, ["nodes", "drain", "n0", "--reason", "bad fan", "--api-url", url])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "node n0 drained (bad fan)" in out.out
    code = await asyncio.to_thread(
        rally, ["nodes", "undrain", "n0", "--reason", "fan fixed", "--api-url", url]
    )
    out = capsys.readouterr()
    assert code == 0 and "node n0 is up" in out.out

    await _lose(event_log, "n1")
    code = await asyncio.to_thread(rally, ["nodes", "undrain", "n1", "--reason", "x", "--api-url", url])
    out = capsys.readouterr()
    assert code != 0
    assert "cannot undrain node n1" in out.err and "lost" in out.err

    monkeypatch.setenv("RALLY_TOKEN", tokens.nlp)
    code = await asyncio.to_thread(rally, ["nodes", "drain", "n0", "--reason", "x", "--api-url", url])
    out = capsys.readouterr()
    assert code != 0 and "cannot drain node n0" in out.err and "admin" in out.err
