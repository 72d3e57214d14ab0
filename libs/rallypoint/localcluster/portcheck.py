"""Is a port the local cluster means to listen on free, and if not, who holds it?

`rally up` asks before it starts anything, so a port another cluster (or any program) holds is one clear
line at once, naming the port's role, its holder when this user may know it (another `rally up`'s folder,
from its ``.rally/cluster.json``) and the flag that picks another port, instead of a service dying
seconds later with a cut log line. The holder comes from /proc: the listening socket's inode, the process
that has it open, and up its parents to a process whose folder holds a cluster file naming the port.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rallypoint.infra import free_port

_HOST = "127.0.0.1"
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
CLUSTER_FILE = Path(".rally") / "cluster.json"


@dataclass(frozen=True, slots=True)
class Port:
    """A port the cluster will listen on: what it is for and the flag that moves it ("" if none)."""

    number: int
    role: str
    flag: str = ""


class PortTaken(RuntimeError):
    """A port the cluster needs is held by another process; the message says by whom and what to do."""


def bindable(port: int, host: str = _HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as a server binds it (SO_REUSEADDR): a port left in TIME_WAIT by a stopped cluster is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(ports: list[Port], *, proc: Path = Path("/proc")) -> None:
    """PortTaken naming the first port of ``ports`` that another process holds; None when all are free."""
    for port in ports:
        if not bindable(port.number):
            raise PortTaken(taken_message(port, holder(port.number, proc=proc)))


def taken_message(port: Port, held_by: str) -> str:
    move = f"; pass {port.flag} {free_port()} (free now) or stop it" if port.flag else "; stop it and retry"
    return f"port {port.number} ({port.role}) is taken by {held_by}{move}. Nothing was started."


def holder(port: int, *, proc: Path = Path("/proc")) -> str:
    """Who listens on ``port``, as well as this user may know: a local cluster's folder, else a pid and
    its program, else "another program" (another user's process, whose descriptors we cannot read)."""
    inodes = set(_listening_inodes(port, proc))
    pid = next((pid for pid in _pids(proc) if inodes & _socket_inodes(proc / str(pid))), None)
    if pid is None:
        return "another program (not one of this user's)"
    for ancestor in _ancestry(pid, proc):
        folder = _cluster_folder(ancestor, port, proc)
        if folder is not None:
            return f"the local cluster of {folder} (rally up, pid {ancestor})"
    return f"pid {pid} ({_program(pid, proc)})"


def _listening_inodes(port: int, proc: Path) -> Iterator[str]:
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                yield inode


def _pids(proc: Path) -> Iterator[int]:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _socket_inodes(process: Path) -> set[str]:
    try:
        fds = list((process / "fd").iterdir())
    except OSError:  # gone, or another user's
        return set()
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:  # closed meanwhile (the listing's own descriptor, for one)
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    return inodes


def _ancestry(pid: int, proc: Path) -> Iterator[int]:
    """``pid``, its parent, and so on up to (not including) PID 1."""
    while pid > 1:
        yield pid
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; comm may hold spaces


def _cluster_folder(pid: int, port: int, proc: Path) -> Path | None:
    """The folder of ``pid`` when it holds a cluster file that names ``port`` (a `rally up` there)."""
    try:
        folder = Path(os.readlink(proc / str(pid) / "cwd"))
        info = json.loads((folder / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return None
    urls = [info.get("api_url"), *(info.get("metrics_urls") or {}).values()]
    return folder if any(_port_of(url) == port for url in urls) else None


def _port_of(url: object) -> int | None:
    try:
        return urllib.parse.urlsplit(str(url)).port
    except ValueError:
        return None


def _program(pid: int, proc: Path) -> str:
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "unknown"
    words = " ".join(arg.decode(errors="replace") for arg in argv[:3]).split()  # one line, whatever it ran
    line = " ".join(words) or "unknown"
    return line if len(line) <= 80 else line[:77] + "..."
