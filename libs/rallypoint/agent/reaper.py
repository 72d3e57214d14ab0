"""Reaping children nobody holds a handle for, without stealing an exit status someone waits for.

The launcher reaps the wrappers it spawned through their ``Popen`` handles (``Popen.poll`` until the
wrapper is gone). Two kinds of children are left, which this module reaps:

- **strays**: wrappers this *process* spawned through a launcher that is gone (an in-process agent
  restart, a test simulating a crash); a new launcher knows their pid and start time from the
  ``rank-<r>.pid`` files, and ``reap_child`` reaps exactly that process once it has exited;
- **orphans**: processes the kernel re-parented to us because their parent died, which happens when
  the agent is PID 1 of its container (Kubernetes runs ``exec rally serve agent`` as PID 1) or a
  subreaper: a rank whose wrapper was SIGKILLed, a helper a rank double-forked. ``OrphanReaper`` reaps
  zombie children that are not in the set of pids the caller owns.

Never ``os.waitpid(-1, ...)``: it would take the status of any child, including one a ``Popen`` object
elsewhere in the process is about to wait for (which then reads a made-up 0). Reaping is always by
pid, of a process seen as a zombie. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Collection

from rallypoint.agent import workdir

_PR_GET_CHILD_SUBREAPER = 37


def orphans_come_to_us() -> bool:
    """Whether the kernel re-parents orphans to this process: it is PID 1 of its namespace, or a child
    subreaper. Otherwise they go to an ancestor, never to us, and sweeping ``/proc`` for them (every
    process's stat file, several times a second) would find none at a real cost on a busy node."""
    if os.getpid() == 1:
        return True
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return True  # cannot tell: sweep, as before
    return flag.value != 0


def zombie_children(parent: int | None = None) -> set[int]:
    """Pids of the children of ``parent`` (default: this process) that have exited and wait to be reaped."""
    me = os.getpid() if parent is None else parent
    zombies: set[int] = set()
    with contextlib.suppress(OSError):
        # /proc/<pid>/task/<tid>/children would be cheaper but needs CONFIG_PROC_CHILDREN, often absent.
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                stat = workdir.proc_stat(int(entry.name))
                if stat is not None and stat[0] == "Z" and stat[1] == me:
                    zombies.add(int(entry.name))
    return zombies


def reap_child(pid: int, start_time: int | None) -> bool:
    """Reap ``pid`` if it is our exited child with that start time; True once there is nothing left
    to do (reaped now, reaped by someone else, or not our child), False while it still runs."""
    stat = workdir.proc_stat(pid)
    if stat is None:
        return True
    state, parent, started = stat
    if parent != os.getpid() or (start_time is not None and started != start_time):
        return True
    if state != "Z":
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return True


class OrphanReaper:
    """Reaps zombie children outside ``owned``, but only those seen as zombies on two sweeps in a row.

    The second look is the margin for a ``Popen`` this module does not know of (another thread's
    ``subprocess.run``): its owner reaps it as soon as it exits, so a zombie that is still there a
    sweep later belongs to nobody.
    """

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self.reaped = 0

    def sweep(self, owned: Collection[int] = ()) -> int:
        zombies = zombie_children() - set(owned)
        ripe = zombies & self._seen
        self._seen = zombies - ripe
        for pid in ripe:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        self.reaped += len(ripe)
        return len(ripe)
