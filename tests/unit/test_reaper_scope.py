"""The agent sweeps ``/proc`` for orphans only where the kernel re-parents them to it (PID 1 of its
container, or a child subreaper): elsewhere the sweep reads every process's stat file several times a
second and can find nothing (rallypoint.agent.reaper.orphans_come_to_us)."""

from __future__ import annotations

import subprocess
import sys

PROBE = (
    "import ctypes\n"
    "from rallypoint.agent.reaper import orphans_come_to_us\n"
    "before = orphans_come_to_us()\n"
    "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"  # PR_SET_CHILD_SUBREAPER
    "print(before, orphans_come_to_us())\n"
)


def test_orphans_come_to_a_subreaper_and_to_pid_1_only() -> None:
    # the probe is never PID 1, and a subreaper's children are not subreapers: False until it becomes one
    probe = [sys.executable, "-c", PROBE]
    out = subprocess.run(probe, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "True"]
