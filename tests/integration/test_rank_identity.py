"""A rank holds no cluster identity (issue 30, item 1), proven with a real agent process and real ranks.

The agent runs as ``rally serve agent`` does, as root (this machine's), with its NATS user and password in
its environment, a DSN and a token beside them, and a credential file in its own folder. Its rank looks
for them as a tenant's job would: its environment, its user, every file it can read under the agent's
folders, every ``/proc/<pid>/environ`` and ``cmdline`` it can read (the agent's and its wrapper's
included). None of them may turn up. Before issue 30 the rank inherited the agent's environment and ran
as root: all of them did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from test_agent import NODE, first_heartbeat  # this folder is on sys.path (rootdir-relative imports)

from rallypoint.agent import RankLauncher
from rallypoint.agent.rankuser import give_to, job_uid
from rallypoint.agent.workdir import read_record
from rallypoint.eventlog import EventLog
from rallypoint.events import subjects
from rallypoint.infra import ManagedProcess, NatsServer
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.protocol import LaunchReply, LaunchTask, RankSpec

PY = sys.executable
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="ranks run as another user only under a root agent")

# What a curious rank does: everything it can read, printed as one JSON line (its log is the agent's).
SEARCH = r"""
import json, os, sys
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode(errors="replace")
    except OSError:
        return None
files = {}
for top in sys.argv[1:]:
    for folder, _, names in os.walk(top):
        for name in names:
            text = read(os.path.join(folder, name))
            if text is not None:
                files[os.path.join(folder, name)] = text
proc = {}
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    for kind in ("environ", "cmdline"):
        text = read(f"/proc/{pid}/{kind}")
        if text:
            proc[f"{pid}/{kind}"] = text
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "cwd": os.getcwd(), "env": dict(os.environ), "files": files, "proc": proc}), flush=True)
"""


class Secrets(msgspec.Struct):
    nats_password: str
    token: str
    dsn_password: str
    file_secret: str

    def all(self) -> list[str]:
        return [self.nats_password, self.token, self.dsn_password, self.file_secret]


def start_agent(
    url: str, folder: Path, found: Secrets, *extra: str, rank_user: str | None = None
) -> ManagedProcess:
    """The agent as its own process, its cwd ``folder`` (holding a credential file only its user reads)."""
    home = folder / "agent-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "agent.creds").write_text(f"password={found.file_secret}\n")
    (home / "agent.creds").chmod(0o600)
    env = {
        **{name: os.environ[name] for name in ("PATH", "PYTHONPATH") if name in os.environ},
        "RALLY_NATS_USER": "agent-node-1",
        "RALLY_NATS_PASSWORD": found.nats_password,
        "RALLY_TOKEN": found.token,
        "RALLY_POSTGRES_DSN": f"postgresql://rally:{found.dsn_password}@127.0.0.1:5432/rally",
    }
    if rank_user is not None:
        env["RALLY_RANK_USER"] = rank_user
    argv = [
        PY, "-m", "rallypoint_services.agent", "--nats-url", url, "--node-id", NODE, "--gpus", "2",
        "--backend", "sim", "--work-dir", str(folder / "work"), "--heartbeat-interval", "0.2",
        "--log-format", "text", *extra,
    ]  # fmt: skip
    return ManagedProcess(argv, log_path=folder / "agent.log", env=env, cwd=home)


@pytest.fixture
def secrets_() -> Secrets:
    return Secrets(*(secrets.token_hex(12) for _ in range(4)))


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    try:
        yield started
    finally:
        for agent in started:
            await asyncio.to_thread(agent.stop, 10.0)
        for pid_file in tmp_path.rglob("rank-*.pid"):
            record = read_record(pid_file) or {}
            for key in ("pid", "wrapper_pid"):
                if isinstance(record.get(key), int):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(record[key], signal.SIGKILL)


async def launch(log: EventLog, job_id: str, command: list[str]) -> LaunchReply:
    task = LaunchTask(
        job_id=job_id,
        attempt=0,
        node_id=NODE,
        node_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=29500,
        command=tuple(command),
        ranks=(RankSpec(rank=0, local_rank=0, gpus=(0,)),),
        env={"JOB_OWN": "visible"},
    )
    msg = await log.nc.request(
        subjects.agent_command(NODE, "launch"), msgspec.json.encode(task), timeout=30.0
    )
    return msgspec.json.decode(msg.data, type=LaunchReply)


async def rank_output(folder: Path, job_id: str, timeout: float = 60.0) -> str:
    return await asyncio.to_thread(finished_rank_log, folder / "work" / job_id, timeout)


def finished_rank_log(job_dir: Path, timeout: float) -> str:
    """Rank 0's log once its exit is recorded (its wrapper writes the exit after the rank's output)."""
    deadline = time.monotonic() + timeout
    while not (exits := sorted(job_dir.glob("*/rank-0.exit"))):
        assert time.monotonic() < deadline, f"rank 0 of {job_dir.name} did not exit"
        time.sleep(0.1)
    log = exits[0].with_suffix(".log").read_text()
    assert (read_record(exits[0]) or {}).get("exit_code") == 0, log
    return log


def proc_text(pid: int, kind: str) -> str:
    return Path(f"/proc/{pid}/{kind}").read_bytes().decode(errors="replace")


@needs_root
async def test_a_rank_finds_no_credential_of_its_agent_and_runs_as_a_user_of_its_own(
    event_log: EventLog,
    nats_server: NatsServer,
    agents: list[ManagedProcess],
    tmp_path: Path,
    secrets_: Secrets,
) -> None:
    agent = start_agent(nats_server.url, tmp_path, secrets_)
    agents.append(agent)
    await first_heartbeat(event_log, timeout=30.0)
    # The secrets are there to be found: in the agent's environment and its folder (read here as root).
    environ = proc_text(agent.pid, "environ")
    assert (
        secrets_.nats_password in environ and secrets_.token in environ and secrets_.dsn_password in environ
    )
    reply = await launch(
        event_log, "curious", [PY, "-c", SEARCH, str(tmp_path), str(tmp_path / "agent-home")]
    )
    assert reply.ok, reply
    log = await rank_output(tmp_path, "curious")
    seen = json.loads(log.strip().splitlines()[-1])

    for secret in secrets_.all():
        assert secret not in log, f"a credential reached the rank: {secret}"
    nobody = pwd.getpwnam("nobody")  # its group and home, with a uid of the job's own
    assert seen["uid"] == seen["euid"] == job_uid("curious") != os.getuid()
    assert seen["gid"] == nobody.pw_gid and seen["groups"] in ([], [nobody.pw_gid])
    assert not any(word in name for name in seen["env"] for word in ("NATS", "PASSWORD", "TOKEN", "DSN"))
    assert seen["env"]["JOB_OWN"] == "visible" and seen["env"]["RANK"] == "0"
    attempt = tmp_path / "work" / "curious" / "0"
    assert seen["cwd"] == str(attempt.resolve())
    # Of the agent's folders it sees its own attempt's and nothing else (the sandbox covers the rest).
    assert seen["files"] and all(path.startswith(str(attempt.resolve())) for path in seen["files"])
    assert f"{agent.pid}/environ" not in seen["proc"]


@needs_root
async def test_an_agent_refuses_to_run_ranks_as_itself_unless_told_and_then_says_so(
    event_log: EventLog,
    nats_server: NatsServer,
    agents: list[ManagedProcess],
    tmp_path: Path,
    secrets_: Secrets,
) -> None:
    # No such user: the sandbox cannot be made, so a rank could only run as root, the agent's user.
    refused = start_agent(nats_server.url, tmp_path / "a", secrets_, rank_user="no-such-rank-user")
    agents.append(refused)
    code = await asyncio.to_thread(refused.popen.wait, 60.0)
    text = (tmp_path / "a" / "agent.log").read_text()
    assert code == 2, text
    assert "no user 'no-such-rank-user'" in text and "--allow-root-ranks" in text

    allowed = start_agent(
        nats_server.url, tmp_path / "b", secrets_, "--allow-root-ranks", rank_user="no-such-rank-user"
    )
    agents.append(allowed)
    await first_heartbeat(event_log, timeout=30.0)
    warning = [
        line for line in (tmp_path / "b" / "agent.log").read_text().splitlines() if "RANKS RUN AS" in line
    ]
    assert warning and "WARNING" in warning[0] and "ROOT" in warning[0], warning
    reply = await launch(event_log, "as-root", [PY, "-c", "import os; print('uid', os.getuid())"])
    assert reply.ok, reply
    assert "uid 0" in await rank_output(tmp_path / "b", "as-root")


@needs_root
@pytest.mark.slow
def test_a_tenants_rank_on_a_local_cluster_finds_none_of_its_secrets() -> None:
    """The whole local cluster, its folder open to others as `rally up`'s .rally/local is: a team's job
    searches it, and every process's environ and cmdline, for the NATS passwords and the API tokens."""
    folder = Path(tempfile.mkdtemp(prefix="rally-identity-"))
    folder.chmod(0o755)
    try:
        with LocalCluster(
            folder / "cluster", nodes=1, gpus_per_node=2, racks=1, with_projector=False
        ) as cluster:
            assert cluster.rank_user == "nobody" and cluster.credentials is not None
            team = cluster.teams[0]
            body = {"name": "curious", "team": team, "gpus": 1, "gpus_per_task": 1,
                    "command": [PY, "-c", SEARCH, str(cluster.workdir)]}  # fmt: skip
            status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body, token=cluster.token_for(team))
            assert status == 202, answer
            log = finished_rank_log(cluster.workdir / "agents" / "node-1" / answer["job_id"], 90.0)
            found = [
                *cluster.credentials.passwords.values(),
                cluster.admin_token,
                *cluster.team_tokens.values(),
            ]
            seen = json.loads(log.strip().splitlines()[-1])
            assert seen["files"], "the rank did search the cluster's folder"
            # of it, only what its sandbox binds back: its attempt's folder, checkpoints/, shared/
            visible = {Path(path).relative_to(cluster.workdir).parts[0] for path in seen["files"]}
            assert visible <= {"agents", "checkpoints", "shared"}, visible
            assert all(f"/agents/node-1/{answer['job_id']}/" in p for p in seen["files"] if "/agents/" in p)
            for secret in found:
                assert secret not in log, "a credential of the cluster reached a tenant's rank"
            assert seen["uid"] == job_uid(answer["job_id"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_the_numpy_example_checkpoints_and_reports_as_the_rank_user(tmp_path: Path) -> None:
    """The training client as nobody in its sandbox: its checkpoint folder under a 0700 one, given to the
    rank user as the local cluster gives its root (``give_to``), its report file the wrapper hands over."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"
    checkpoints = tmp_path / "checkpoints"
    give_to(checkpoints, "nobody")
    # The example's folder is shown to the rank as the local cluster shows it (an agent --rank-path): a
    # checkout in a private folder (a home, mktemp -d) is not the rank user's to enter.
    launcher = RankLauncher(tmp_path / "work", run_as="nobody", shared_paths=[example.parent])
    task = LaunchTask(
        job_id="numpy",
        attempt=1,
        node_id=NODE,
        node_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=29501,
        command=(PY, str(example), "--steps", "6", "--step-time", "0", "--ckpt-every", "3", "--size", "64"),
        ranks=(RankSpec(rank=0, local_rank=0, gpus=()),),
        env={"RALLY_CHECKPOINT_DIR": str(checkpoints / "numpy")},
    )
    launcher.launch(task)
    log = finished_rank_log(tmp_path / "work" / "numpy", 120.0)
    folder = checkpoints / "numpy"  # the job's own: made by the wrapper, its uid's alone
    assert (folder / "final-rank-0.sha256").stat().st_uid == job_uid("numpy"), log
    assert folder.stat().st_uid == job_uid("numpy") and folder.stat().st_mode & 0o777 == 0o700
    reports = (tmp_path / "work" / "numpy" / "1" / "rank-0.report").read_text()
    assert '"step": 6' in reports or '"step":6' in reports, reports
