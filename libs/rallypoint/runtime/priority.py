"""CPU priority: a service no job waits on yields the cores to those on a job's way to running.

Where services share cores (``rally up``, or several services on one machine under systemd), those whose
work may come later and whom nobody waits on (the projector, PostgreSQL's writer, and the preemption
reporter) run at a lower priority, ``nice`` 10 by default (``config.CPU_NICE``): when the cores are busy,
the services a job or a person waits on get them first, and these catch up a little later, each wake-up
then taking more events at once (docs/benchmarks.md, "CPU priority"). In a container of its own a
process's niceness orders nothing but its own threads: give such services a lower CPU request.

A process only ever lowers its priority here: raising it needs a privilege a service should not have.
"""

from __future__ import annotations

import logging
import os

_log = logging.getLogger("rallypoint.runtime")

#: The niceness ``nice(1)`` allows a process to ask for (0: the default priority, 19: the lowest).
MAX_NICE = 19


def lower_cpu_priority(niceness: int) -> int:
    """Run this process (its threads from now on) at ``niceness`` or lower priority; the niceness after.

    A process started at a higher niceness than asked keeps it; where the platform has no priorities
    (or refuses), it runs as it is and says so once in the log."""
    if not 0 <= niceness <= MAX_NICE:
        raise ValueError(f"niceness {niceness} is not between 0 and {MAX_NICE}")
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if niceness > current:
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError) as exc:
        _log.warning("CPU priority left as it is (niceness %d not set: %s)", niceness, exc)
        return niceness
