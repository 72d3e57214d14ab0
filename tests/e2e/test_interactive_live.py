"""End to end: interactive sessions on a real local cluster (issue 35, Build item 4).

``rally run --pty -- bash`` is driven through a pseudo-terminal, as a person at a terminal would: it
submits an interactive job, waits until it runs, and relays the terminal to the rank through the API and
NATS (never to the node directly). The shell shows its slice, exits 3, and the job ends with that status.
A client that disconnects is reattached (``rally attach``) within the team's grace; one that does not come
back has its job cancelled, the reason recorded. Another team's token gets no terminal (404).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster_jobs import job, log_records, submit, wait_for

from rallypoint.events import JobCancelRequested
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

GRACE_S = 4.0
IDLE_S = 3.0
RALLY = [sys.executable, "-m", "rallypoint.cli.main"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("interactive")
    queues = folder / "queues.yaml"
    teams = [
        {"name": name, "nominal": 1, "interactive_disconnect_grace_s": GRACE_S} for name in ("ml", "other")
    ]
    teams.append({"name": "idle", "nominal": 0, "interactive_idle_timeout_s": IDLE_S})
    queues.write_text(yaml.safe_dump({"teams": teams}))
    local = LocalCluster(folder / "cluster", nodes=1, gpus_per_node=2, racks=1, queues=queues)
    with local:
        yield local


class Terminal:
    """A ``rally`` command on a pseudo-terminal of its own: what it prints, and keys typed into it."""

    def __init__(self, cluster: LocalCluster, team: str, *args: str) -> None:
        master, slave = pty.openpty()
        self.resize(slave, 30, 100)
        self.modes = termios.tcgetattr(slave)  # as a person's terminal is before `rally run`
        env = {**os.environ, "RALLY_API_URL": cluster.api_url, "RALLY_TOKEN": cluster.token_for(team)}
        self.process = subprocess.Popen(
            [*RALLY, *args], stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # its terminal: SIGWINCH reaches it
        )  # fmt: skip
        self.master, self.slave = master, slave
        self.seen = b""

    @staticmethod
    def resize(fd: int, rows: int, cols: int) -> None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, pattern: str, timeout: float = 60.0, since: int = 0) -> re.Match[bytes]:
        """Read until ``pattern`` shows in the output from byte ``since`` on (what was read before stays in
        ``seen``)."""
        deadline = time.monotonic() + timeout
        while (found := re.compile(pattern.encode()).search(self.seen, since)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never saw {pattern!r}; the terminal showed {self.seen!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                with contextlib.suppress(OSError):  # EIO: the command exited, its output is all read
                    self.seen += os.read(self.master, 65536)
        return found

    def wait(self, timeout: float = 60.0) -> int:
        with contextlib.suppress(OSError):
            while select.select([self.master], [], [], 0.2)[0] and (chunk := os.read(self.master, 65536)):
                self.seen += chunk
        return self.process.wait(timeout)

    def kill(self) -> None:
        """The client dies (a laptop closed): no goodbye to the API."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def open_terminal(terminals: list[Terminal], cluster: LocalCluster, team: str, *args: str) -> Terminal:
    terminal = Terminal(cluster, team, *args)
    terminals.append(terminal)
    return terminal


def job_id_of(terminal: Terminal) -> str:
    return terminal.expect(r"job (\S+) submitted").group(1).decode()


def test_shell_shows_its_slice_and_exits_with_its_status(cluster: LocalCluster, terminals: list) -> None:
    shell = open_terminal(terminals, cluster, "ml", "run", "--gpus", "1", "--pty", "--", "bash", "--norc")
    job_id = job_id_of(shell)
    try:
        shell.expect(r"\$ |# ")  # the prompt: the rank's terminal, through the API
    except AssertionError as exc:
        raise AssertionError(f"{exc}; job {job(cluster, job_id)}") from None
    shell.type("echo slice=$CUDA_VISIBLE_DEVICES job=$RALLY_JOB_ID; tty; stty size\r")
    shell.expect(rf"slice=\d job={job_id}")
    shell.expect(r"/dev/pts/\d+\r\n30 100\r\n")  # a real terminal, the size of ours
    before = len(shell.seen)
    shell.resize(shell.slave, 40, 120)  # the window grows: SIGWINCH, and the rank's terminal follows
    deadline = time.monotonic() + 30
    while True:  # asked until it shows: the resize travels beside the keys, and may come after them
        shell.type("stty size\r")
        try:
            shell.expect(r"[\r\n]40 120\r\n", timeout=3, since=before)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
    shell.type("sleep 60\r")
    time.sleep(0.5)
    shell.type("\x03")  # Ctrl-C: the rank's foreground command is interrupted, not rally
    shell.type("echo rc=$?\r")
    shell.expect(r"rc=130", timeout=20)
    shell.type("exit 3\r")
    assert shell.wait() == 3
    assert termios.tcgetattr(shell.slave) == shell.modes  # our terminal as it was, out of raw mode
    view = wait_for(cluster, job_id, lambda v: v["state"] == "failed", "failed with the shell's status")
    assert view["exit_code"] == 3
    assert view["spec"]["kind"] == "interactive" and view["spec"]["priority"] == "interactive"


def test_reattach_within_the_grace_and_cancel_after_it(cluster: LocalCluster, terminals: list) -> None:
    first = open_terminal(terminals, cluster, "ml", "run", "--gpu-fraction", "0.25", "--pty", "--", "sh")
    job_id = job_id_of(first)
    first.expect(r"\$ |# ")
    first.type("echo share=$RALLY_GPU_MILLI\r")
    first.expect(r"share=250")
    first.kill()

    # another team cannot reach it, not even to learn it exists
    status, answer = call(
        "GET", f"{cluster.api_url}/v1/jobs/{job_id}/terminal", token=cluster.token_for("other")
    )
    assert status == 404, answer
    again = open_terminal(terminals, cluster, "ml", "attach", job_id)
    again.expect(r"share=250")  # the recent screen comes back first
    again.type("echo back\r")
    again.expect(r"\r\nback\r\n")
    again.kill()

    view = wait_for(cluster, job_id, lambda v: v["state"] == "cancelled", "cancelled after the grace", 60)
    assert view["state"] == "cancelled"
    assert cancel_reasons(cluster, job_id) == [f"interactive session disconnected for {GRACE_S:g} s"]
    assert job(cluster, job_id)["state"] == "cancelled"


def cancel_reasons(cluster: LocalCluster, job_id: str) -> list[str | None]:
    return [
        e.reason for _, e in log_records(cluster, "interactive-test") if isinstance(e, JobCancelRequested)
        and e.job_id == job_id
    ]  # fmt: skip


def test_an_idle_session_ends_and_its_job_is_cancelled(cluster: LocalCluster, terminals: list) -> None:
    shell = open_terminal(terminals, cluster, "idle", "run", "--gpu-fraction", "0.25", "--pty", "--", "sh")
    job_id = job_id_of(shell)
    shell.expect(r"\$ |# ")
    shell.type("echo busy\r")
    shell.expect(r"\r\nbusy\r\n")
    shell.expect(rf"session closed: idle for {IDLE_S:g} s", timeout=30)  # then nothing is typed or printed
    assert shell.wait() == 125
    wait_for(cluster, job_id, lambda v: v["state"] == "cancelled", "cancelled for idling")
    assert cancel_reasons(cluster, job_id) == [f"interactive session idle for {IDLE_S:g} s"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_published_port_is_reached_through_the_api_and_only_by_its_team(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    port, local = free_port(), free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    job_id = submit(cluster, "notebook", server, team="ml", gpu_milli=250, ports=[port])
    wait_for(cluster, job_id, lambda v: v["state"] == "running", "running")
    for team, asked, status in (("other", port, 404), ("ml", port + 1, 409)):
        answer = call(
            "GET", f"{cluster.api_url}/v1/jobs/{job_id}/ports/{asked}", token=cluster.token_for(team)
        )
        assert answer[0] == status, answer
    env = {**os.environ, "RALLY_API_URL": cluster.api_url, "RALLY_TOKEN": cluster.token_for("ml")}
    said_path = tmp_path / "port-forward.stderr"
    said = said_path.open("wb")
    forward = subprocess.Popen(
        [*RALLY, "port-forward", job_id, str(port), "--local-port", str(local)],
        env=env, stderr=said, start_new_session=True,
    )  # fmt: skip
    try:
        # its stderr goes to a file: a pipe nobody reads fills with its "port N: ..." lines while the
        # server is not listening yet, and a forwarder blocked writing one cannot exit at Ctrl-C
        deadline = time.monotonic() + 30
        while b"reaches port" not in said_path.read_bytes():
            assert time.monotonic() < deadline, said_path.read_bytes()
            time.sleep(0.1)
        deadline, page, url = time.monotonic() + 60, "", f"http://127.0.0.1:{local}/"
        while "Directory listing" not in page:  # until the server listens (the agent refuses before)
            assert time.monotonic() < deadline, page
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=10) as answer:
                page = answer.read().decode()
            time.sleep(0.3)
        assert "rank-0.log" in page  # the rank's own folder, served on the node, read here
    finally:
        forward.send_signal(signal.SIGINT)
        assert forward.wait(60) == 0, said_path.read_text(errors="replace")
        said.close()
        call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
