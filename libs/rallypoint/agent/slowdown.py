"""A slow node that really is slow: the agent duty-cycles its ranks with SIGSTOP / SIGCONT.

When the backend reports a slowdown factor F > 1 (the simulated backend's ``node:slow=F`` fault), every
``period_s`` the rank process groups of this node are stopped for ``(1 - 1/F)`` of the period and run
for the rest, so each gets about 1/F of the wall time it would have had: a simulated straggler whose
step times (reported by the training client) really grow, with no change to the rank's code.

Never leave a rank stopped:

- every stop is followed by a continue, in a ``finally``; ``close()`` cuts a stop phase short;
- the first pass continues every group it is given (an agent that died mid-stop left them stopped);
- a stopped process keeps a SIGTERM pending until it runs again, so ``wake()`` (the agent's kill path)
  cuts the stop phase short, and ranks with a kill request are no longer stopped at all
  (``launcher_groups``); SIGKILL works on a stopped process anyway.

Groups are (pgid, kernel start time) pairs, signalled through ``workdir.signal_group``, so a reused pid
is never signalled.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from rallypoint.agent import workdir
from rallypoint.agent.launcher import RankLauncher

_log = logging.getLogger(__name__)

#: (process group id, the leader's kernel start time or None when unknown)
Group = tuple[int, int | None]

#: Short enough that a training step (tens of ms to seconds) sees the average rate, not a few long
#: pauses it may slip between (a step shorter than the run phase would often not be slowed at all, and its
#: median step time would hide the straggler); long enough that the signals cost little (two per group
#: and period: 40/s per rank).
DEFAULT_PERIOD_S = 0.05


class DutyCycler:
    """Runs the process groups ``groups()`` returns at ~1/factor of wall time, on a thread of its own
    (a busy event loop must not stretch the stop phases). ``start()``, ``set_factor()``, ``close()``."""

    def __init__(self, groups: Callable[[], Iterable[Group]], *, period_s: float = DEFAULT_PERIOD_S) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be > 0")
        self._groups = groups
        self._period_s = period_s
        self._factor = 1.0
        self._closed = threading.Event()
        # Set by set_factor / wake / close: ends a stop phase (or an idle wait) at once.
        self._interrupt = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    @property
    def factor(self) -> float:
        return self._factor

    def set_factor(self, factor: float) -> None:
        """1 (or less): run at full speed; F > 1: about 1/F of wall time."""
        factor = max(1.0, float(factor))
        if factor != self._factor:
            _log.info("slowdown factor %.2f -> %.2f", self._factor, factor)
            self._factor = factor
            self._interrupt.set()

    def wake(self) -> None:
        """Continue the stopped groups now (a kill's SIGTERM is delivered only to a running process)."""
        self._interrupt.set()

    def start(self) -> None:
        if self._thread is None:
            self._closed.clear()  # an agent object may be started again after close()
            self._thread = threading.Thread(target=self._run, name="rank-slowdown", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop cycling; every group is left running (the thread continues whatever it stopped)."""
        self._closed.set()
        self._interrupt.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        self._signal_all(self._current(), signal.SIGCONT)
        while not self._closed.is_set():
            factor = self._factor
            if factor <= 1.0:
                # Nothing to cycle until the factor changes (set_factor) or the cycler closes: both set the
                # event, so sleep until then instead of waking every period on every healthy node.
                self._interrupt.wait()
                self._interrupt.clear()
                continue
            run_s = self._period_s / factor
            self._stop_phase(self._period_s - run_s)
            self.cycles += 1
            self._closed.wait(run_s)

    def _stop_phase(self, stop_s: float) -> None:
        stopped = self._signal_all(self._current(), signal.SIGSTOP)
        try:
            self._interrupt.wait(stop_s)
            self._interrupt.clear()
        finally:
            self._signal_all(stopped, signal.SIGCONT)

    def _current(self) -> list[Group]:
        try:
            return list(self._groups())
        except Exception:
            # The agent's rank list being briefly unreadable must not kill the thread: skip this period.
            _log.exception("listing rank process groups failed")
            return []

    @staticmethod
    def _signal_all(groups: Iterable[Group], sig: signal.Signals) -> list[Group]:
        return [g for g in groups if workdir.signal_group(g[0], g[1], sig)]


def rank_group(directory: Path, rank: int) -> Group | None:
    """A rank's process group from its wrapper's pid file; None before the rank started, or once a kill
    was requested (stopping it then would only hold its SIGTERM back)."""
    if workdir.rank_file(directory, rank, "kill").exists():
        return None
    pids = workdir.read_record(workdir.rank_file(directory, rank, "pid"))
    if pids is None or not pids.get("pid"):
        return None
    return int(pids["pid"]), pids.get("pid_start")


class LauncherGroups:
    """The running ranks' process groups of one ``RankLauncher``, as a ``DutyCycler`` wants them."""

    def __init__(self, launcher: RankLauncher) -> None:
        self._launcher = launcher

    def __call__(self) -> list[Group]:
        groups = []
        for r in self._launcher.status():
            if r.exit_code is not None:
                continue
            directory = workdir.attempt_dir(self._launcher.work_dir, r.job_id, r.attempt)
            group = rank_group(directory, r.rank)
            if group is not None:
                groups.append(group)
        return groups
