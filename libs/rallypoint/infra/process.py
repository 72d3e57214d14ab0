"""Child processes that cannot outlive us: own process group, parent-death signal, atexit sweep.

Servers started for tests and local clusters must never be orphaned, because an orphaned
nats-server or postgres keeps its port and data directory and breaks the next run in confusing ways.
Three layers, each catching what the previous one misses:

1. every server runs in its own process group, so ``stop()`` signals the server and anything it
   forked (postgres backends) at once, and a Ctrl-C in the terminal does not hit it mid-test;
2. on Linux the child asks the kernel for ``PR_SET_PDEATHSIG`` so it is signalled when we die, even by
   SIGKILL, where no Python cleanup can run;
3. an ``atexit`` hook stops whatever is still running when the interpreter exits normally.

Caveat of (2): the kernel ties the parent-death signal to the *thread* that forked the child, so
servers must be spawned from a long-lived thread (the main thread or the event loop's thread), never
from a thread-pool worker that may exit while the server should keep running.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

_log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

# Loaded in the parent: loading a library after fork() in the child could deadlock on locks held by
# other threads of the parent at the moment of the fork.
_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover - exotic libc
    _libc = None


def _pdeathsig_preexec(sig: int, parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the child between fork and exec: only async-signal-safe work here.
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then nobody would ever signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class ManagedProcess:
    """A server process in its own process group, stopped on request, on parent death and at exit."""

    _live: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
    _live_lock = threading.Lock()

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        stop_signal: int = signal.SIGTERM,
        death_signal: int = signal.SIGKILL,
        user: str | None = None,
        group: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.stop_signal = stop_signal
        log_file: IO[bytes]
        with open(log_path, "ab") as log_file:
            # The child keeps its own copy of the descriptor; ours can close right away.
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_pdeathsig_preexec(death_signal, os.getpid()),
                user=user,
                group=group,
                env=env,
                cwd=cwd,
                close_fds=True,
                pass_fds=pass_fds,
            )
        self.pid = self.popen.pid
        with self._live_lock:
            self._live.add(self)

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful stop signal to the leader, then SIGKILL to the whole group; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self.stop_signal)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _log.warning(
                    "pid %s ignored signal %s for %.1fs; killing its group",
                    self.pid,
                    self.stop_signal,
                    timeout,
                )
        # Always sweep the group: a server's helpers (postgres backends) may linger after the leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5.0)
        with self._live_lock:
            self._live.discard(self)
        return self.popen.returncode

    @classmethod
    def stop_all(cls) -> None:
        with cls._live_lock:
            live = list(cls._live)
        for proc in live:
            with contextlib.suppress(Exception):
                proc.stop(timeout=5.0)


def wait_until(check: Callable[[], bool], *, proc: ManagedProcess, timeout: float, what: str) -> None:
    """Poll ``check`` until true; fail fast with the server's log if the process died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if not proc.running():
            raise ServerStartError(f"{what} exited with code {proc.popen.returncode}:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise ServerStartError(f"{what} not ready after {timeout:.0f}s:\n{proc.log_tail()}")
        time.sleep(0.02)


def respawn(
    old: ManagedProcess | None,
    spawn: Callable[[], ManagedProcess],
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
) -> ManagedProcess:
    """Reap ``old`` (dead or alive: its whole group goes, so nothing is left defunct), spawn a new one and
    wait until it is ready. For servers restarted on their own port and data by a supervisor."""
    if old is not None:
        old.stop(timeout=5.0)
    proc = spawn()
    try:
        wait_until(ready, proc=proc, timeout=timeout, what=what)
    except ServerStartError:
        proc.stop()
        raise
    return proc


class ServerStartError(RuntimeError):
    """A server process did not come up; the message carries the tail of its log."""


atexit.register(ManagedProcess.stop_all)


async def await_until(check: Callable[[], bool], *, proc: ManagedProcess, timeout: float, what: str) -> None:
    """``wait_until`` for coroutines: sleeps on the event loop instead of blocking it."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if not proc.running():
            raise ServerStartError(f"{what} exited with code {proc.popen.returncode}:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise ServerStartError(f"{what} not ready after {timeout:.0f}s:\n{proc.log_tail()}")
        await asyncio.sleep(0.02)
