"""CPU time of processes by pid, read from /proc: what the benches charge each process of a cluster.

Process CPU (user + system) rather than wall time, so other work on the same cores does not move a
figure; PostgreSQL's work is done by its backends, children of the server process, hence ``tree``.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) ``pid`` has used so far; None when it is gone."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    """Every live process under ``root``: its children, theirs, and so on."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(_stat_fields(int(entry))[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], {root}
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = set(children)
    return found


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and its live descendants (one that exited takes its share with it);
    None when ``root`` is gone."""
    own = cpu_seconds(root)
    if own is None:
        return None
    return own + sum(s for pid in descendants(root) if (s := cpu_seconds(pid)) is not None)
