"""A hostile rank (run by tests/e2e/test_tenant_attack.py as a job of another team): it looks everywhere a
rank can for a cluster credential, then tries every forgery it can against a victim job, and writes down
what it found and what each attempt got. Standard library only: it runs as whatever user the agent gives
ranks, with whatever the sandbox lets it reach.

    python tenant_attack.py REPORT NATS_HOST:PORT API_URL VICTIM_JOB VICTIM_NODE [ROOT ...]

Everything it learns goes into REPORT (JSON); the test decides what counts as a leak.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 1 << 18
MAX_TOTAL_BYTES = 32 << 20
SCAN_SECONDS = 20.0
#: Installed code, not credentials: a machine's /tmp may hold whole virtualenvs and checkouts.
SKIPPED_FOLDERS = frozenset(
    {"site-packages", "dist-packages", ".venv", ".git", "node_modules", "__pycache__"}
)
SECRETISH = ("PASSWORD", "TOKEN", "SECRET", "NATS", "DSN", "CREDENTIAL", "KEY")


def readable_files(roots: list[str], deadline: float) -> dict[str, str]:
    """Every file under ``roots`` this user can read (up to 256 KiB each, 32 MiB in all), until
    ``deadline``; installed code (``SKIPPED_FOLDERS``) is passed over."""
    found: dict[str, str] = {}
    total = 0
    for root in roots:
        for folder, dirs, files in os.walk(root, onerror=lambda _: None):
            dirs[:] = [
                d for d in dirs if d not in SKIPPED_FOLDERS and not os.path.islink(os.path.join(folder, d))
            ]
            for name in files:
                if time.monotonic() > deadline or total > MAX_TOTAL_BYTES:
                    return found
                path = os.path.join(folder, name)
                try:
                    if os.path.getsize(path) <= MAX_FILE_BYTES:
                        found[path] = Path(path).read_text(errors="replace")
                        total += len(found[path])
                except OSError:
                    continue
    return found


def other_processes() -> dict[str, str]:
    """What /proc shows of every other process: its environment and command line, where readable."""
    seen: dict[str, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("environ", "cmdline"):
            try:
                seen[f"/proc/{pid}/{part}"] = (
                    Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
                )
            except OSError:
                continue
    return seen


def nats_try(address: str, user: str | None, password: str | None, publishes: list[tuple[str, bytes]]) -> str:
    """CONNECT (with ``user``/``password`` when given), then publish; the server's first verdict."""
    host, port = address.rsplit(":", 1)
    connect: dict[str, Any] = {"verbose": True, "pedantic": False, "name": "tenant", "lang": "raw"}
    if user is not None:
        connect.update(user=user, pass_=password)
        connect["pass"] = connect.pop("pass_")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.settimeout(5)
            sock.recv(4096)  # INFO
            wire = b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n"
            for subject, payload in publishes:
                wire += f"PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n"
            sock.sendall(wire + b"PING\r\n")
            answer = b""
            end = time.monotonic() + 5
            while time.monotonic() < end and b"ERR" not in answer and answer.count(b"PONG") < 2:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
            return answer.decode(errors="replace")[:500]
    except OSError as exc:
        return f"error: {exc}"


def http_try(method: str, url: str, token: str | None, body: dict[str, Any] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return -1


def forgeries(victim: str, node: str) -> list[tuple[str, bytes]]:
    """The bus forgeries of issue 30, aimed at the victim job and its node."""
    exit_1 = {"type": "RankExited.v1", "job_id": victim, "attempt": 1, "rank": 0, "node_id": node,
              "exit_code": 1, "at": time.time()}  # fmt: skip
    lost = {"type": "NodeLost.v1", "node_id": node, "reason": "forged", "at": time.time()}
    drained = {"type": "NodeDrained.v1", "node_id": node, "reason": "forged", "at": time.time()}
    big = {"type": "NodeRegistered.v1", "node_id": node, "address": "x", "rack": "rack-x", "gpu_type": "sim",
           "gpus": [], "cpu_milli": 1, "memory_mib": 1, "agent_instance": "x", "at": time.time()}  # fmt: skip
    return [
        (f"rally.agent.{node}.job.{victim}", json.dumps(exit_1).encode()),
        (f"rally.node.{node}.health", json.dumps(lost).encode()),
        (f"rally.node.{node}", json.dumps(lost).encode()),
        (f"rally.node.{node}.op", json.dumps(drained).encode()),
        (f"rally.node.{node}.agent", json.dumps(big).encode()),
        # a planted snapshot for the scheduler, and the record that would vouch for it
        ("$O.rally-snapshots-scheduler.M.Y2x1c3Rlci1zdGF0ZQ==", b"{}"),
        ("rally.snap.scheduler", b'{"type":"SnapshotTaken.v1"}'),
    ]


def credentials_in(texts: dict[str, str]) -> list[tuple[str | None, str | None]]:
    """Every (user, password) pair worth trying: none, guessed users, and any found in the environment or in
    what it could read (another process's environ, a config file)."""
    pairs: list[tuple[str | None, str | None]] = [(None, None), ("agent-node-1", ""), ("admin", "")]
    sources = [os.environ, *(_assignments(text) for text in texts.values())]
    for found in sources:
        if found.get("RALLY_NATS_USER") or found.get("RALLY_NATS_PASSWORD"):
            pairs.append((found.get("RALLY_NATS_USER"), found.get("RALLY_NATS_PASSWORD")))
    return pairs


def _assignments(text: str) -> dict[str, str]:
    """NAME=value pairs of a NUL- or newline-separated environment dump."""
    pairs = (item.partition("=") for item in re.split(r"[\x00\n]", text))
    return {name: value for name, eq, value in pairs if eq and name.startswith("RALLY_")}


def api_attempts(api: str, victim: str, node: str, token: str | None) -> dict[str, int]:
    job = {"name": "x", "team": "nlp", "gpus": 1, "gpus_per_task": 1, "command": ["true"]}
    return {
        "cancel_victim": http_try("DELETE", f"{api}/v1/jobs/{victim}", token),
        "read_victim": http_try("GET", f"{api}/v1/jobs/{victim}", token),
        "cancel_victim_no_token": http_try("DELETE", f"{api}/v1/jobs/{victim}", None),
        "drain_victim_node": http_try("POST", f"{api}/v1/nodes/{node}/drain", token, {"reason": "x"}),
        "nul_gpu_type": http_try("POST", f"{api}/v1/jobs", token, {**job, "gpu_type": "h\u0000100"}),
        "checkpoint_dir_etc": http_try("POST", f"{api}/v1/jobs", token, {**job, "checkpoint_dir": "/etc"}),
        "production": http_try("POST", f"{api}/v1/jobs", token, {**job, "priority": "production"}),
    }


def main(argv: list[str]) -> int:
    report_path, nats_address, api, victim, node, *roots = argv
    deadline = time.monotonic() + SCAN_SECONDS
    home = os.environ.get("HOME", "/")
    texts = {**readable_files([os.getcwd(), home, *roots], deadline), **other_processes()}
    report: dict[str, Any] = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "env": dict(os.environ),
        "argv": sys.argv,
        "suspicious_env": sorted(k for k in os.environ if any(s in k.upper() for s in SECRETISH)),
        "files": texts,
    }
    report["nats"] = [
        {"user": user, "answer": nats_try(nats_address, user, password, forgeries(victim, node))}
        for user, password in credentials_in(texts)
    ]
    report["http"] = api_attempts(api, victim, node, os.environ.get("TEAM_TOKEN"))
    Path(report_path).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
