"""`rally up` in the foreground: it comes up, and Ctrl-C stops all of it, leaving no process behind; its
output and its processes' command lines show no password (issue 30)."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.infra import free_port
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow


def _processes_mentioning(*needles: str) -> list[str]:
    listing = subprocess.run(
        ["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in listing.splitlines() if any(n in line for n in needles) and "ps -ww" not in line]


def test_ctrl_c_stops_every_process_rally_up_started(tmp_path: Path) -> None:
    port = free_port()
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rallypoint.cli.main",
            "up",
            "--nodes",
            "2",
            "--racks",
            "1",
            "--api-port",
            str(port),
            "--data-dir",
            str(tmp_path / "state"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        info_file = tmp_path / ".rally" / "cluster.json"
        while not info_file.exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "rally up did not come up"
            time.sleep(0.3)
        info = json.loads(info_file.read_text())
        _check_tokens(tmp_path / ".rally" / "tokens.json", info["api_url"])
        nats_port = info["nats_url"].rsplit(":", 1)[1]
        pg_port = info["postgres_dsn"].rsplit(":", 1)[1].split("/")[0]
        needles = (str(tmp_path), f"--port {nats_port}", f"-p {pg_port}")
        assert _processes_mentioning(*needles), "the cluster's processes should be visible while it runs"
        _second_up_refuses(tmp_path, info_file, up.pid)
        passwords = _passwords(tmp_path / "state", up.pid)
        assert _processes_mentioning(*passwords) == [], "a password on a command line"
        _run_two_jobs(info["api_url"], json.loads((tmp_path / ".rally" / "tokens.json").read_text())["admin"])
        assert len(_processes_mentioning(RANK_COMMAND)) >= 2, "the ranks run, each a real process"
        _audit_passes_with_no_flags(tmp_path)
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=60)
    output = up.stdout.read() if up.stdout else ""
    assert code == 0, output
    _check_banner(output, passwords)
    time.sleep(1.0)
    assert _processes_mentioning(*needles) == []
    assert _processes_mentioning(RANK_COMMAND) == [], "Ctrl-C left ranks running"
    assert not info_file.exists(), "rally up removes its cluster file on the way out"
    assert not (tmp_path / ".rally" / "tokens.json").exists(), "and its tokens"


#: What the two jobs' ranks run: a duration of this run's own, so no other process on the machine (another
#: run's leftover, say) sleeps it.
RANK_COMMAND = f"sleep 3{secrets.randbelow(1000):03d}.{secrets.randbelow(10**6):06d}"


def _run_two_jobs(api_url: str, admin: str) -> None:
    """Two jobs of 4 GPUs (within team nlp's quota) whose ranks run until stopped, running on return."""
    body = {"name": "long", "team": "nlp", "gpus": 4, "gpus_per_task": 4, "command": RANK_COMMAND.split()}
    jobs = [call("POST", f"{api_url}/v1/jobs", {**body, "name": f"long-{i}"}, token=admin) for i in range(2)]
    assert all(status == 202 for status, _ in jobs), jobs
    deadline = time.monotonic() + 60
    for _, answer in jobs:
        while call("GET", f"{api_url}/v1/jobs/{answer['job_id']}", token=admin)[1]["state"] != "running":
            assert time.monotonic() < deadline, "the jobs did not start"
            time.sleep(0.3)


def _audit_passes_with_no_flags(folder: Path) -> None:
    """`rally replay --verify-decisions` typed as the README has it: every decision so far is replayed
    under the settings the scheduler recorded (rally up's queue file and repair wait), and passes."""
    argv = [sys.executable, "-m", "rallypoint.cli.main", "replay", "--verify-decisions"]
    audit = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "settings recorded by the scheduler" in audit.stdout, audit.stdout


def _passwords(data_dir: Path, up_pid: int) -> set[str]:
    """Every password of the cluster, from its owner-only files: each NATS user's (the server's accounts)
    and PostgreSQL's two roles' (the embedded server's folder, named for the `rally up` process)."""
    accounts = (data_dir / "nats" / "accounts.conf").read_text()
    nats = set(re.findall(r'password: "([^"]+)"', accounts))
    assert len(nats) > 10, "admin, sys, every service and every agent have their own"
    (pg_credentials,) = Path(tempfile.gettempdir()).glob(f"rally-pg-{up_pid}-*/credentials.json")
    postgres = set(json.loads(pg_credentials.read_text()).values())
    assert len(postgres) == 2, "the superuser's and the read models' role's"
    return nats | postgres


def _check_banner(output: str, secrets: set[str]) -> None:
    """The banner says where the credentials are, and shows none of them."""
    assert "rallypoint is up" in output, output
    shown = sorted(secret for secret in secrets if secret in output)
    assert shown == [], f"rally up printed {len(shown)} password(s)"
    for line in ("  NATS ", "  SQL "):
        (printed,) = [text for text in output.splitlines() if text.startswith(line)]
        assert ":***@" in printed and ".rally/cluster.json" in printed, printed


def _second_up_refuses(folder: Path, info_file: Path, first_pid: int) -> None:
    """A second `rally up` on the same folder refuses at once, naming the first, and changes nothing."""
    before = info_file.read_bytes(), (folder / ".rally" / "tokens.json").read_bytes()
    argv = [sys.executable, "-m", "rallypoint.cli.main", "up", "--api-port", str(free_port())]
    second = subprocess.run(
        [*argv, "--data-dir", str(folder / "state")], cwd=folder, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "already runs" in second.stderr and f"pid {first_pid}" in second.stderr, second.stderr
    assert (info_file.read_bytes(), (folder / ".rally" / "tokens.json").read_bytes()) == before
    # Another data folder in the same folder would still overwrite .rally/cluster.json: refused too.
    other = subprocess.run(
        [*argv, "--data-dir", str(folder / "other")], cwd=folder, capture_output=True, text=True, timeout=30
    )
    assert other.returncode == 1 and "already runs" in other.stderr, other.stderr
    assert not (folder / "other" / "nats").exists()
    info = json.loads(info_file.read_text())
    assert call("GET", f"{info['api_url']}/v1/jobs", token=json.loads(before[1])["admin"])[0] == 200


def _check_tokens(path: Path, api_url: str) -> None:
    """An admin token and one per default team, owner-only; the API takes them and nothing else."""
    assert path.stat().st_mode & 0o777 == 0o600
    tokens = json.loads(path.read_text())
    assert set(tokens["teams"]) >= {"demo", "nlp"}
    assert call("GET", f"{api_url}/v1/jobs", token="")[0] == 401
    assert call("GET", f"{api_url}/v1/jobs", token=tokens["admin"])[0] == 200
    nlp = tokens["teams"]["nlp"]
    assert call("GET", f"{api_url}/v1/jobs?team=demo", token=nlp)[0] == 403


def test_tokens_and_revocations_survive_a_restart_of_the_folder(tmp_path: Path) -> None:
    """`rally up` again in the same folder is the same cluster: the tokens it gave out, the ones `rally
    tokens create` made and every revocation stay as they were; only a revoked cluster token is replaced."""
    port = free_port()
    with _running_up(tmp_path, port) as first:
        made = _rally(tmp_path, "tokens", "create", "--team", "nlp", "-o", "json")
        revoked = _rally(tmp_path, "tokens", "create", "--team", "nlp", "-o", "json")
        (demo,) = [t for t in _rally(tmp_path, "tokens", "list", "-o", "json") if t["user"] == "demo"]
        for token_id in (revoked["id"], demo["id"]):
            _rally(tmp_path, "tokens", "revoke", token_id, "-o", "json")
    with _running_up(tmp_path, port) as second:
        api = second["info"]["api_url"]
        assert second["tokens"]["admin"] == first["tokens"]["admin"]
        assert second["tokens"]["teams"]["nlp"] == first["tokens"]["teams"]["nlp"]
        assert second["tokens"]["teams"]["demo"] != first["tokens"]["teams"]["demo"], "revoked: replaced"
        kept = [first["tokens"]["admin"], first["tokens"]["teams"]["nlp"], made["token"]]
        assert [call("GET", f"{api}/v1/jobs", token=token)[0] for token in kept] == [200, 200, 200]
        refused = [revoked["token"], first["tokens"]["teams"]["demo"]]
        assert [call("GET", f"{api}/v1/jobs", token=token)[0] for token in refused] == [401, 401]
        assert call("GET", f"{api}/v1/jobs?team=demo", token=second["tokens"]["teams"]["demo"])[0] == 200


def _rally(folder: Path, *argv: str) -> Any:
    """A `rally` command run in ``folder``; its JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "rallypoint.cli.main", *argv], cwd=folder, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@contextlib.contextmanager
def _running_up(folder: Path, port: int) -> Iterator[dict[str, Any]]:
    """`rally up` in ``folder`` on ``port``, until its cluster file and tokens are there; stopped with
    Ctrl-C on the way out. Yields its cluster file ("info") and its tokens."""
    argv = [sys.executable, "-m", "rallypoint.cli.main", "up", "--nodes", "1", "--api-port", str(port)]
    up = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        info_file = folder / ".rally" / "cluster.json"
        deadline = time.monotonic() + 240  # generous: a loaded 2-core machine takes minutes
        while not info_file.exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "rally up did not come up"
            time.sleep(0.3)
        tokens = json.loads((folder / ".rally" / "tokens.json").read_text())
        yield {"info": json.loads(info_file.read_text()), "tokens": tokens}
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0, up.stdout.read() if up.stdout else ""
