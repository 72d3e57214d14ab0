"""The rank wrapper: ``python -m rallypoint.agent.rankwrap --dir D --rank R -- command...``.

One wrapper per rank, started by the agent in a session of its own so the rank survives the agent
(crash, restart, upgrade). The wrapper

1. refuses to start if the agent already gave the rank up (exit file present) or a kill is pending;
2. starts the command in a new process group (the agent signals that group to stop the rank) with a
   parent-death signal, so a rank can never run on unsupervised if its wrapper is SIGKILLed;
3. records both pids with their kernel start times in ``rank-<r>.pid``;
4. waits, and writes the exit code once, atomically, to ``rank-<r>.exit`` (see ``workdir`` for codes).

With ``--user`` (the agent runs as root; ``rankuser``) the command runs as that user's group with a uid
of its job's own (``rankuser.job_identity``) and umask 077, and the wrapper stays root to keep its
records; the job's checkpoint folder is made and given to that uid (0700). The rank's report file is
created first and handed to that uid, and the wrapper builds the rank's mount namespace
(``ranksandbox``): the rank reaches the interpreter, the package, its own attempt folder and checkpoint
folder, and nothing else of the folders its user cannot enter. The rank starts in its attempt folder,
never in the agent's.

The wrapper is a child subreaper: a process the rank started and then abandoned (a double-forked
helper, the children of a shell that exited) is re-parented to the wrapper rather than to PID 1 -
which in the agent's container is the agent - and the wrapper reaps it while it waits for the rank.
Such helpers still running when the rank exits are left alone (they move up to PID 1 when the wrapper
exits).

Signals sent to the wrapper itself (SIGTERM, SIGINT, SIGHUP) are forwarded to the rank's group, so
stopping the wrapper stops the rank and still records how it ended.

With ``--pty`` (an interactive job) the rank runs on a pseudo-terminal, the leader of its own session, and
the wrapper relays that terminal (``ptyhost``); a SIGTERM reaches it as a hang-up first (an interactive
shell ignores SIGTERM, and exits on SIGHUP as when its terminal goes away).

Standard library only (plus ``workdir``): it runs once per rank and should start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rallypoint.agent import ptyhost, ranksandbox, rankuser, workdir

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _libc() -> ctypes.CDLL | None:
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _become_subreaper() -> None:
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _wait_rank(child: subprocess.Popen[bytes]) -> int:
    """Wait for the rank, reaping adopted orphans meanwhile; the rank's ``returncode``.

    ``waitpid(-1)`` is safe here: every child of the wrapper is the rank or an orphan of it.
    """
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            _reap_exited()
            return child.returncode


def _reap_exited() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _pdeathsig(parent_pid: int, *, private: bool = False, terminal: bool = False) -> Callable[[], None]:
    # Loaded before fork: loading a library in the child between fork and exec is not safe.
    libc = _libc()

    def preexec() -> None:
        if private:  # a rank of its own uid: what it creates is its job's alone
            os.umask(0o077)
        if terminal:  # its stdin, the pty's slave, becomes the controlling terminal of its new session
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the wrapper died between fork and prctl
            os._exit(workdir.EXIT_LOST & 0xFF)

    return preexec


def _finish(directory: Path, rank: int, exit_code: int) -> None:
    workdir.write_atomic(
        workdir.rank_file(directory, rank, "exit"),
        {"exit_code": exit_code, "at": time.time()},
        exclusive=True,
    )


def _as_user(user: str | None, directory: Path, shared: list[str]) -> dict[str, Any]:
    """Popen arguments that start the rank as ``user`` in its sandbox (none: as the wrapper's own user)."""
    if user is None:
        return {}
    try:
        uid, gid, env = rankuser.job_identity(user, os.environ.get("RALLY_JOB_ID"))
    except KeyError:
        raise PermissionError(f"no user {user!r} on this host") from None
    _own_checkpoint_folder(os.environ.get("RALLY_CHECKPOINT_DIR"), uid, gid)
    report = os.environ.get("RALLY_REPORT_FILE")
    if report:
        # The training client appends to it; the folder is root's, so the file must exist and be theirs.
        Path(report).touch()
        os.chown(report, uid, gid)
    # Before the drop, as root: the rank sees what it needs of the agent's folders, nothing else.
    ranksandbox.enter(uid, gid, str(directory), os.environ.get("RALLY_CHECKPOINT_DIR"), shared)
    # setgroups, setgid, setuid happen before preexec_fn, so the parent-death signal set there survives.
    return {"user": uid, "group": gid, "extra_groups": [], "env": {**os.environ, **env}}


def _own_checkpoint_folder(folder: str | None, uid: int, gid: int) -> None:
    """The job's checkpoint folder, made by root and given to the job's uid alone (0700): no other job's
    rank can read or replace its shards. Where root may not (NFS with root_squash), the rank makes it."""
    if not folder:
        return
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        os.chown(folder, uid, gid)
        os.chmod(folder, 0o700)


def run(
    directory: Path,
    rank: int,
    command: list[str],
    *,
    user: str | None = None,
    shared: list[str] | None = None,
    pty: bool = False,
) -> int:
    exit_path = workdir.rank_file(directory, rank, "exit")
    if exit_path.exists():
        print(f"rankwrap: rank {rank} already has an exit record; not starting", file=sys.stderr)
        return 0
    if workdir.rank_file(directory, rank, "kill").exists():
        print(f"rankwrap: rank {rank} was killed before it started", file=sys.stderr)
        _finish(directory, rank, workdir.exit_code_of(-signal.SIGTERM))
        return 0

    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
            return
        for sent in (signal.SIGHUP, signum) if pty and signum == signal.SIGTERM else (signum,):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sent)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    _become_subreaper()

    host: ptyhost.PtyHost | None = None
    try:
        streams, slave, host = _streams(directory, rank, pty)
        try:
            child = subprocess.Popen(
                command,
                preexec_fn=_pdeathsig(os.getpid(), private=user is not None, terminal=pty),
                close_fds=True,
                cwd=directory,
                **streams,
                **_as_user(user, directory, shared or []),
            )
        finally:
            if slave is not None:
                os.close(slave)  # the rank holds it now: the master reads EIO once the rank is gone
    except FileNotFoundError as exc:
        print(f"rankwrap: cannot start rank {rank}: {exc}", file=sys.stderr)
        _finish(directory, rank, workdir.EXIT_NOT_FOUND)
        return 0
    except (PermissionError, OSError) as exc:
        print(f"rankwrap: cannot start rank {rank}: {exc}", file=sys.stderr)
        _finish(directory, rank, workdir.EXIT_NOT_EXECUTABLE)
        return 0
    for signum in pending:
        forward(signum, None)

    workdir.write_atomic(
        workdir.rank_file(directory, rank, "pid"),
        {
            "wrapper_pid": os.getpid(),
            "wrapper_start": workdir.process_start_time(os.getpid()),
            "pid": child.pid,
            "pid_start": workdir.process_start_time(child.pid),
        },
    )
    # The agent may have declared this rank lost while we were starting (it only does so when it cannot
    # see us for a long time); its record wins, so do not leave a rank running that nobody accounts for.
    if exit_path.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)

    returncode = _wait_rank(child) if host is None else host.serve(child)
    _finish(directory, rank, workdir.exit_code_of(returncode))
    return 0


def _streams(
    directory: Path, rank: int, pty: bool
) -> tuple[dict[str, Any], int | None, ptyhost.PtyHost | None]:
    """Popen's stream and session arguments; with a pty, also its slave (to close once the rank has it)
    and the host that relays its master. A rank with a terminal leads a session of its own (a process
    group alone cannot have one); its group is still the one the agent signals."""
    if not pty:
        return {"stdin": subprocess.DEVNULL, "process_group": 0}, None, None
    master, slave = ptyhost.open_pty()
    server = ptyhost.listen(workdir.rank_file(directory, rank, "tty"))
    host = ptyhost.PtyHost(master, server, log_fd=sys.stdout.fileno())
    streams = {"stdin": slave, "stdout": slave, "stderr": slave, "start_new_session": True}
    return streams, slave, host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankwrap", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="the attempt directory")
    parser.add_argument("--rank", required=True, type=int)
    parser.add_argument("--user", default=None, help="run the command as this user (the wrapper is root)")
    parser.add_argument(
        "--reach", action="append", default=[], help="a folder shared with every rank (with --user)"
    )
    parser.add_argument("--pty", action="store_true", help="run the rank on a pseudo-terminal (interactive)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given")
    return run(args.dir, args.rank, command, user=args.user, shared=args.reach, pty=args.pty)


if __name__ == "__main__":
    sys.exit(main())
