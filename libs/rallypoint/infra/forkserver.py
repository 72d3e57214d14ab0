"""A preloaded fork server: the local cluster's Python services, each its own process, without each
paying the interpreter's imports again.

Every service of a local cluster is ``python -m rallypoint.cli.serve NAME ...``, and importing what one
needs (nats-py and the aiohttp it pulls in, msgspec, asyncpg, OpenTelemetry, numpy, our own modules)
costs about a second of CPU; a cluster of six nodes starts fifteen of them, so the imports alone were
most of a cluster's start. The fork server imports all of that once, then forks one child per service:
the child is a real process of its own (own pid, own process group, own log, own environment, its own
parent-death signal), running the same ``rally serve`` entry point with the same arguments, sharing
nothing mutable with its siblings (copy-on-write memory).

Protocol, JSON lines over a socket pair (``ForkServer`` is the supervisor's end):

- supervisor -> server ``{"preload": [modules]}`` first; server -> supervisor ``{"op": "ready"}`` once
  it has imported them;
- supervisor -> server ``{"op": "spawn", "id", "argv", "env", "cwd", "log"}`` (``argv``: the module
  and its arguments, as after ``python -m``); the reply is
  ``{"op": "spawned", "id", "pid"}`` (or ``{"op": "failed", "id", "error"}``);
- server -> supervisor ``{"op": "exit", "pid", "code"}`` for each child it reaps (``code`` as
  ``subprocess.Popen.returncode`` has it: negative for a signal).

What a fork cannot carry over, and how: the server stays single-threaded (fork is safe only then, and it
refuses to serve otherwise); no preloaded module reads the environment at import, since a child's is
set after the fork (``rallypoint.runtime.following`` reads its variables when its loop starts, and
tests/unit/test_forkserver.py fails on a module that reads one at import); ``random`` is reseeded by
the interpreter in each child. The one thing shared is the string hash seed (``PYTHONHASHSEED``), which
only decides hash-flooding resistance.

If the server dies, every child it forked dies with it (parent-death signal); it dies with the
supervisor in the same way (``ManagedProcess``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .process import ManagedProcess, ServerStartError

__all__ = ["PRELOAD", "ForkServer", "ForkedProcess"]

#: Imported once by the server. Third-party libraries first, then our services' modules (which import
#: the rest of ours); no module here reads the environment when imported (the server checks).
PRELOAD: tuple[str, ...] = (
    "asyncio",
    "nats",
    "nats.js",
    "aiohttp",
    "aiohttp.web",
    "msgspec",
    "asyncpg",
    "numpy",
    "prometheus_client",
    "opentelemetry.sdk.trace",
    "rallypoint.cli.serve",
    *(
        f"rallypoint_services.{name}.service"
        for name in (
            "api",
            "inventory",
            "health_monitor",
            "scheduler",
            "preemption",
            "checkpoint",
            "job_controller",
            "projector",
            "predictor",
            "agent",
        )
    ),
)
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
READY_TIMEOUT_S = 120.0
SPAWN_TIMEOUT_S = 60.0


# --- the supervisor's end ----------------------------------------------------------------------------


class ForkServer:
    """A running fork server, started at once; ``spawn`` waits for its preload the first time."""

    def __init__(self, log_path: Path, preload: Sequence[str] = PRELOAD) -> None:
        ours, theirs = socket.socketpair()
        self.proc = ManagedProcess(
            [sys.executable, "-m", __name__, str(theirs.fileno())],
            log_path=log_path,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        ours.sendall(json.dumps({"preload": list(preload)}).encode() + b"\n")
        self._sock = ours
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._ready = False
        self._closed = False
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self._sock.makefile("rb") as lines:
            for line in lines:
                self._dispatch(json.loads(line))
        with self._changed:
            # The server is gone, and its children with it (their parent-death signal): none runs on.
            self._closed = True
            for pid in self._children - set(self._exits):
                self._exits[pid] = -signal.SIGKILL
            self._changed.notify_all()

    def _dispatch(self, message: dict[str, Any]) -> None:
        with self._changed:
            op = message["op"]
            if op == "ready":
                self._ready = True
            elif op == "exit":
                self._exits[int(message["pid"])] = int(message["code"])
            else:
                self._replies[int(message["id"])] = message
            self._changed.notify_all()

    def _wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    state = "exited" if self._closed else f"did not answer in {timeout:.0f}s"
                    raise ServerStartError(f"fork server {state} ({what}):\n{self.proc.log_tail()}")
                self._changed.wait(min(left, 1.0))

    def spawn(self, argv: Sequence[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> int:
        """Fork a child running ``argv`` (``python -m MODULE ...``, as ``exec`` would run it); its pid."""
        if len(argv) < 3 or argv[1] != "-m":
            raise ValueError(f"the fork server runs `python -m MODULE ...` only, not {list(argv)}")
        self._wait(lambda: self._ready, READY_TIMEOUT_S, "preloading")
        with self._send_lock:
            self._next_id += 1
            request_id = self._next_id
            request = {"op": "spawn", "id": request_id, "argv": list(argv[2:]), "env": env}
            request |= {"cwd": str(cwd), "log": str(log_path)}
            self._sock.sendall(json.dumps(request).encode() + b"\n")
        self._wait(lambda: request_id in self._replies, SPAWN_TIMEOUT_S, f"spawning {argv[2:4]}")
        with self._changed:
            reply = self._replies.pop(request_id)
            if reply["op"] != "spawned":
                raise ServerStartError(f"fork server could not start {argv[2:4]}: {reply.get('error')}")
            pid = int(reply["pid"])
            self._children.add(pid)
            return pid

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int:
        """The child's exit code once it has ended; ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self._exits:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {pid}", timeout or 0.0)
                self._changed.wait(left)
            return self._exits[pid]

    def stop(self) -> None:
        """Stop the server (after its children: the supervisor stops those first)."""
        self.proc.stop(timeout=5.0)
        with contextlib.suppress(OSError):
            self._sock.close()


class _ForkedPopen:
    """What ``ManagedProcess`` reads of a ``subprocess.Popen``, for a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.server.wait_exit(self.pid, timeout)
        return self.returncode


class ForkedProcess(ManagedProcess):
    """A service forked by a ``ForkServer``: stopped, polled and swept like any ``ManagedProcess``."""

    def __init__(
        self, server: ForkServer, argv: Sequence[str], *, log_path: Path, env: dict[str, str], cwd: Path
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.stop_signal = signal.SIGTERM
        pid = server.spawn(argv, env=env, cwd=cwd, log_path=log_path)
        self.popen = _ForkedPopen(server, pid)  # type: ignore[assignment]
        self.pid = pid
        with self._live_lock:
            self._live.add(self)


# --- the server --------------------------------------------------------------------------------------


def _preload(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)
    if threading.active_count() != 1:
        raise SystemExit(f"forkserver: preloading started threads ({threading.enumerate()}); fork is unsafe")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


class _Lines:
    """JSON lines read from the supervisor's socket, whole ones only."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def fill(self) -> bool:
        """Read what has arrived; False once the supervisor has closed its end."""
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def take(self) -> dict[str, Any] | None:
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message


def _serve(lines: _Lines) -> dict[str, Any] | None:
    """Answer spawn requests until the supervisor closes its end (None), or return the request in the
    child that was forked for it."""
    sock = lines.sock
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of each child
    _send(sock, {"op": "ready"})
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock.fileno() in readable and not lines.fill():
            return None
        while (request := lines.take()) is not None:
            pid = os.fork()
            if pid == 0:
                for fd in (wake_r, wake_w):
                    os.close(fd)
                return request
            # The child makes itself a group leader too; whichever runs first wins, so the group exists
            # before the supervisor hears of the pid (and may signal the group).
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)
            _send(sock, {"op": "spawned", "id": request["id"], "pid": pid})


def _process_name(argv: Sequence[str]) -> bytes:
    """What ``ps`` and ``top`` show for the child (15 bytes at most): ``rally-api``, ``rally-agent``."""
    label = argv[1] if argv[0] == "rallypoint.cli.serve" and len(argv) > 1 else argv[0].rsplit(".", 1)[-1]
    return f"rally-{label}"[:15].encode()


def _become(request: dict[str, Any], server_pid: int) -> None:
    """In the forked child: become the service ``request`` names, as a fresh ``python -m`` would."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(_process_name(request["argv"])), 0, 0, 0)
    if os.getppid() != server_pid:
        os._exit(1)  # the server died between the fork and the prctl: nobody would ever stop us
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])


def main(argv: Sequence[str]) -> int:
    """``python -m rallypoint.infra.forkserver FD``: the socket's descriptor; its first line names the
    modules to preload (not the command line, which every child shows in ``ps``)."""
    lines = _Lines(socket.socket(fileno=int(argv[0])))
    while (first := lines.take()) is None:
        if not lines.fill():
            return 0
    _preload(first["preload"])
    server_pid = os.getpid()
    request = _serve(lines)
    sock = lines.sock
    if request is None:
        return 0
    sock.close()
    _become(request, server_pid)
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
