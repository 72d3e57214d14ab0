"""Every forbidden operation, tried against a live server with the permission matrix (issue 14).

Twice: with the config the local cluster renders (literal passwords) and with the committed
deploy/nats/accounts.conf (environment passwords). A write outside a user's permissions is dropped by the
server and the client sees only a timeout and an async permissions error (GUIDE §6), so each case is judged
by the stream's contents and configuration, never by the client's error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from rallypoint.eventlog import EventLog, NatsCredentials, connect_nats, stored
from rallypoint.eventlog.connection import CLIENT_CLASS
from rallypoint.eventlog.setup import setup_log
from rallypoint.events import (
    JobCompleted,
    JobSpec,
    JobSubmitted,
    NodeDrained,
    NodeLost,
    NodeRegistered,
    RankExited,
    encode,
    subjects,
)
from rallypoint.infra import NatsServer
from rallypoint.security import ADMIN, agent_user
from rallypoint.security.credentials import LocalCredentials
from rallypoint.security.deployfiles import COMPOSE_ACCOUNTS, COMPOSE_NODES, read_nodes
from rallypoint.security.natsconf import literal, password_variable, render_accounts
from rallypoint.security.permissions import inbox_prefix
from rallypoint.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]
LOCAL_NODES = ("node-a", "node-b")
SPEC = JobSpec(name="p", team="t", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))
# A refused JetStream API request is dropped, so the client waits this long for an answer that never comes.
REFUSED_TIMEOUT_S = 1.0


@dataclass
class Secured:
    server: NatsServer
    credentials: LocalCredentials
    nodes: tuple[str, str]
    violations: list[str] = field(default_factory=list)

    async def connect(self, user: str) -> Client:
        async def record(exc: Exception) -> None:
            self.violations.append(f"{user}: {exc}")

        # Our client class, whose flush answers after what was sent before it (nats-py's may not: docs/
        # architecture.md), so "subscribed, flushed" means the server has judged the subscription
        nc = CLIENT_CLASS()
        await nc.connect(
            self.server.url,
            user=user,
            password=self.credentials.passwords[user],
            error_cb=record,
            allow_reconnect=False,
            inbox_prefix=inbox_prefix(user),  # what connect_nats sets: the only inboxes it may listen on
        )
        return nc


@pytest.fixture(params=["local", "deploy"])
async def secured(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Secured]:
    if request.param == "local":
        nodes = LOCAL_NODES
        credentials = LocalCredentials.generate(nodes)
        accounts = render_accounts(nodes, password=literal(credentials.passwords))
    else:
        nodes = tuple(read_nodes(ROOT / COMPOSE_NODES))  # type: ignore[assignment]
        credentials = LocalCredentials.generate(nodes)
        accounts = (ROOT / COMPOSE_ACCOUNTS).read_text()
        for user, password in credentials.passwords.items():  # what compose / k8s put in the environment
            monkeypatch.setenv(password_variable(user), password)
    server = await NatsServer(tmp_path / "nats", accounts=accounts).astart()
    try:
        admin = await connect_nats(server.url, name="acl-admin", credentials=_creds(credentials, ADMIN))
        await setup_log(admin)
        await admin.close()
        yield Secured(server, credentials, (nodes[0], nodes[1]))
    finally:
        await server.astop()


def _creds(credentials: LocalCredentials, user: str) -> NatsCredentials:
    return NatsCredentials(user, credentials.passwords[user])


async def _refused(coro: object) -> None:
    """A JetStream API call the server must drop: it gets no answer (or, at most, an error)."""
    with pytest.raises((nats.errors.TimeoutError, nats.js.errors.APIError, TimeoutError)):
        await coro  # type: ignore[misc]


async def _publish(nc: Client, subject: str, payload: bytes) -> None:
    await nc.publish(subject, payload)
    await nc.flush()


async def _fold(log: EventLog) -> ClusterState:
    state = ClusterState()
    async for rec in log.replay(quarantine=True):
        state.apply_stored(rec.seq, stored(rec))
    return state


async def test_every_forbidden_operation_is_refused(secured: Secured) -> None:
    mine, other = secured.nodes
    admin = await secured.connect(ADMIN)
    log = await EventLog.attach(admin, create=False)
    before = (await log.js.stream_info("RALLY")).config

    # What each identity may write.
    api = await secured.connect("api")
    api_log = await EventLog.attach(api, create=False)
    await api_log.append(
        subjects.job("j1"),
        JobSubmitted(job_id="j1", spec=SPEC, submitted_at=1.0),
        msg_id="j1:0:s",
        source="t",
    )
    agent, other_agent = await secured.connect(agent_user(mine)), await secured.connect(agent_user(other))
    for node_id, nc in ((mine, agent), (other, other_agent)):  # each node registers through its own agent
        registered = NodeRegistered(
            node_id=node_id, address="127.0.0.1", rack="r", gpu_type="sim", gpus=(), cpu_milli=1000,
            memory_mib=1024, agent_instance="a", at=1.0,
        )  # fmt: skip
        await (await EventLog.attach(nc, create=False)).append(
            subjects.node_registration(node_id), registered, msg_id=f"{node_id}:reg", source="t"
        )
    # An operator's drain (`rally nodes drain`): the API writes the operator's node subject, since it serves
    # drain and undrain; which tokens may ask is the API's check (admin only, test_node_drain_api.py).
    await api_log.append(
        subjects.node_operator(mine),
        NodeDrained(node_id=mine, reason="ops", at=1.5, drained_by="root"),
        msg_id="d",
        source="t",
    )
    honest = await log.last_seq()
    assert honest == 4
    assert await api_log.last_seq(subjects.node_facts(mine)) == honest  # the fence each drain reads

    # Rewriting history: delete, truncate to one message, purge, delete one message (as services).
    scheduler = await secured.connect("scheduler")
    job_controller = await secured.connect("job-controller")
    truncated = StreamConfig(**{**before.as_dict(), "max_msgs": 1})  # type: ignore[arg-type]
    await asyncio.gather(
        _refused(api.jetstream(timeout=REFUSED_TIMEOUT_S).delete_stream("RALLY")),
        _refused(agent.jetstream(timeout=REFUSED_TIMEOUT_S).update_stream(truncated)),
        _refused(scheduler.jetstream(timeout=REFUSED_TIMEOUT_S).purge_stream("RALLY")),
        _refused(job_controller.jetstream(timeout=REFUSED_TIMEOUT_S).delete_msg("RALLY", 1)),
        _refused(
            api.jetstream(timeout=REFUSED_TIMEOUT_S).add_stream(StreamConfig(name="SHADOW", subjects=["x.>"]))
        ),
    )

    # Speaking for another node, forging completions: dropped by the server ...
    lost = NodeLost(node_id=other, reason="forged", at=2.0)
    await _publish(agent, subjects.node_health(other), encode(lost))
    # ... a verdict on its own node (only the health monitor judges nodes), or the API posing as the monitor
    own_lost = NodeLost(node_id=mine, reason="forged", at=2.0)
    await _publish(agent, subjects.node_health(mine), encode(own_lost))
    await _publish(api, subjects.node_health(other), encode(lost))
    await _publish(api, subjects.node_registration(other), encode(registered))
    exit_other = RankExited(job_id="j1", attempt=1, rank=0, node_id=other, exit_code=0, at=2.0)
    await _publish(agent, subjects.agent_job(other, "j1"), encode(exit_other))
    await _publish(api, subjects.job_control("j1"), encode(JobCompleted(job_id="j1", attempt=1, at=2.0)))
    await _publish(agent, subjects.heartbeat(other), b"{}")
    # ... or, where the subject is the writer's own, stored but skipped by every fold as misplaced. These two
    # wait for the stream's ack: the server handles one connection's messages in order, so once each is stored
    # every forged message its connection sent before it was dropped or stored, and the count below is final.
    await agent.jetstream().publish(subjects.agent_job(mine, "j1"), encode(exit_other))
    await api.jetstream().publish(subjects.job("j1"), encode(JobCompleted(job_id="j1", attempt=1, at=2.0)))
    with contextlib.suppress(nats.errors.TimeoutError):  # a publish the server dropped is never acked
        await admin.flush()

    info = await log.js.stream_info("RALLY")
    assert info.config == before, "the stream's configuration is unchanged"
    assert (info.state.first_seq, info.state.last_seq, info.state.messages) == (1, honest + 2, honest + 2)
    landed = [rec.subject async for rec in log.replay(quarantine=True)][honest:]
    # two connections publish these: the server may store them in either order
    assert sorted(landed) == sorted([subjects.agent_job(mine, "j1"), subjects.job("j1")])
    state = await _fold(log)
    assert state.jobs["j1"].state == "pending" and state.jobs["j1"].ranks_exited == {}
    assert state.nodes[other].status == "up" and state.nodes[mine].status == "drained"
    assert state.quarantine.by_reason == {"misplaced": 2}
    assert secured.violations, "the server reported the violations to the clients"
    with pytest.raises(nats.js.errors.NotFoundError):
        await log.js.stream_info("SHADOW")

    for nc in (api, agent, other_agent, scheduler, job_controller, admin):
        await nc.close()


async def test_no_user_no_entry(secured: Secured) -> None:
    async def quiet(_: Exception) -> None:
        pass

    with pytest.raises((nats.errors.NoServersError, nats.errors.Error, OSError)):
        await nats.connect(secured.server.url, error_cb=quiet, allow_reconnect=False, connect_timeout=2)
    with pytest.raises((nats.errors.NoServersError, nats.errors.Error, OSError)):
        await nats.connect(
            secured.server.url, user="api", password="wrong", error_cb=quiet, allow_reconnect=False
        )


async def test_no_identity_hears_another_identity_s_replies(secured: Secured) -> None:
    """Each identity subscribes only to its own inboxes (issue 30): a node agent listening on every inbox,
    or on the API's, is refused and hears nothing of a query the API makes, which still gets its answer
    through ``connect_nats``'s inbox prefix."""
    inventory = await secured.connect("inventory")

    async def answer(msg: Msg) -> None:
        await msg.respond(b"the nodes")

    await inventory.subscribe("q.inventory.nodes", cb=answer)
    await inventory.flush()
    eavesdropper = await secured.connect(agent_user(secured.nodes[0]))
    taps = [await eavesdropper.subscribe(pattern) for pattern in ("_INBOX.>", "_INBOX.api.>")]
    await eavesdropper.flush()  # the server has judged both subscriptions

    api = await connect_nats(
        secured.server.url, name="acl-api", credentials=_creds(secured.credentials, "api")
    )
    reply = await api.request("q.inventory.nodes", b"", timeout=10)
    assert reply.data == b"the nodes" and reply.subject.startswith(f"{inbox_prefix('api')}.")
    # The server queued anything it routed to the eavesdropper before this round trip's answer.
    await eavesdropper.flush()
    assert [tap.pending_msgs for tap in taps] == [0, 0], "another identity received the API's reply"
    for pattern in ("_INBOX.>", "_INBOX.api.>"):
        refused = f'permissions violation for subscription to "{pattern}"'.lower()  # nats-py lowercases it
        assert any(refused in v.lower() for v in secured.violations), secured.violations
    for nc in (inventory, eavesdropper, api):
        await nc.close()
