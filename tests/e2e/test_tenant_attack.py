"""A job is a tenant, not a bus identity (issue 30): on a real local cluster, a rank of team nlp searches its
environment, the files it can read, other processes and the network for a cluster credential and tries every
forgery of the issue against a running job of team vision. Nothing it finds is a credential, nothing it tries
is accepted, the victim completes, and the audit passes naming the attempts it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.cli.main import main
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call
from rallypoint.localcluster.supervisor import local_service_seconds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="ranks run as another user than the agent's only when the agent is root (README, Tests)",
    ),
]

ATTACK = Path(__file__).with_name("tenant_attack.py")
VICTIM_ENV = f"env-{secrets.token_hex(8)}"
VICTIM_KEY = f"key-{secrets.token_hex(8)}"
TERMINAL = {"completed", "failed", "cancelled", "rejected"}
QUEUES = {
    "cohorts": [{"name": "all"}],
    "teams": [
        {"name": "nlp", "cohort": "all", "nominal": 6},
        {"name": "vision", "cohort": "all", "nominal": 6},
    ],
}


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can write: ranks run as an unprivileged user, the test as root."""
    folder = Path(tempfile.mkdtemp(prefix="rally-tenant-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def submit(cluster: LocalCluster, team: str, body: dict[str, Any]) -> str:
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body, token=cluster.token_for(team))
    assert status == 202, answer
    return str(answer["job_id"])


def wait(cluster: LocalCluster, job_id: str, states: set[str], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, view = call("GET", f"{cluster.api_url}/v1/jobs/{job_id}")
        if status == 200 and view["state"] in states:
            return view
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} never reached {states}: {view}")


def secrets_of(cluster: LocalCluster) -> dict[str, str]:
    """Every credential of the cluster the tenant must not learn: bus passwords, tokens but its own team's."""
    assert cluster.credentials is not None
    found = {f"nats:{user}": password for user, password in cluster.credentials.passwords.items()}
    found["token:admin"] = cluster.admin_token
    found["victim's env"], found["victim's secret"] = VICTIM_ENV, VICTIM_KEY
    found.update({f"token:{team}": cluster.token_for(team) for team in cluster.teams if team != "nlp"})
    dsn = cluster.postgres_dsn
    if "@" in dsn and ":" in dsn.split("@")[0].split("//")[-1]:
        found["postgres"] = dsn.split("@")[0].split("//")[-1].split(":", 1)[1]
    return found


def audit(cluster: LocalCluster, queues: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    wait_s = local_service_seconds("scheduler", "--repair-wait")
    argv = ["replay", "--verify-decisions", "--nats-url", cluster.nats_url, "--queues", str(queues)]
    code = main([*argv, "--repair-wait", str(wait_s)])
    return code, capsys.readouterr().out


def test_a_tenant_job_can_neither_find_a_credential_nor_forge_anything(
    tmp_path: Path, shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queues = tmp_path / "queues.json"
    queues.write_text(json.dumps(QUEUES))
    attack = shared / ATTACK.name
    shutil.copyfile(ATTACK, attack)
    attack.chmod(0o644)
    go, report_file = shared / "go", shared / "report.json"
    # the cluster's folder is one every user can walk, as a checkout's .rally is: its files guard themselves
    with LocalCluster(shared / "cluster", nodes=3, gpus_per_node=4, racks=1, queues=queues) as cluster:
        assert cluster.nats is not None
        # the victim: a 2-node gang of team vision that runs until the test lets it finish
        hold = f"for i in $(seq 900); do [ -e {go} ] && exit 0; sleep 0.1; done; exit 7"
        victim = submit(
            cluster,
            "vision",
            {
                "name": "victim",
                "team": "vision",
                "gpus": 8,
                "gpus_per_task": 4,
                "command": ["sh", "-c", hold],
                # what its ranks hold in their environment, on the same machine as the tenant's rank
                "env": {"VICTIM_ENV": VICTIM_ENV},
                "secrets": {"VICTIM_KEY": VICTIM_KEY},
            },
        )
        nodes = wait(cluster, victim, {"running"})["nodes"]
        nats_address = cluster.nats.url.removeprefix("nats://")
        command = [sys.executable, str(attack), str(report_file), nats_address, cluster.api_url, victim]
        # its own folder first: /tmp may hold whole virtualenvs, which it reads for 20 s at most
        command += [nodes[0], str(shared), str(cluster.workdir), "/tmp"]
        attacker = submit(
            cluster,
            "nlp",
            {
                "name": "tenant",
                "team": "nlp",
                "gpus": 1,
                "gpus_per_task": 1,
                "command": command,
                # its own team's token, as a CI system hands one to its jobs
                "env": {"TEAM_TOKEN": cluster.token_for("nlp")},
            },
        )
        assert wait(cluster, attacker, TERMINAL, timeout=120)["state"] == "completed"
        report = json.loads(report_file.read_text())
        go.touch()
        done = wait(cluster, victim, TERMINAL)
        code, out = audit(cluster, queues, capsys)

    # what the rank could reach holds no credential of the cluster
    assert report["uid"] != 0 and report["euid"] != 0, "ranks run unprivileged"
    assert not [k for k in report["env"] if k.startswith("RALLY_NATS") or "PASSWORD" in k]
    assert str(attack) in report["files"], "it walked the folders it was pointed at"
    assert any(path.startswith("/proc/") for path in report["files"]), "and read what /proc shows"
    everything = json.dumps(report)
    leaked = sorted(name for name, value in secrets_of(cluster).items() if value and value in everything)
    assert leaked == [], f"the tenant found {leaked}"
    # the bus refused every identity it tried, so none of its forgeries was even read
    for attempt in report["nats"]:
        assert "Authorization Violation" in attempt["answer"], attempt
    # the API refused everything it tried with its own team's token
    http = report["http"]
    assert http["cancel_victim"] == http["read_victim"] == 404  # another team's job is not even there
    assert http["cancel_victim_no_token"] == 401
    assert http["drain_victim_node"] == 403  # operators only
    assert 400 <= http["nul_gpu_type"] < 500 and 400 <= http["checkpoint_dir_etc"] < 500
    assert http["production"] == 403  # reserved for the teams given it
    # the victim ran undisturbed, and the audit passes and names what it saw
    assert (done["state"], done["attempt"]) == ("completed", 1)
    assert code == 0, out
    assert f"  {victim} attempt 1" in out and f"  {attacker} attempt 1" in out
    assert "writers: 0 event(s) not their writer's" in out
    with contextlib.suppress(FileNotFoundError):
        os.unlink(report_file)
