"""How far behind the health monitor reads the heartbeats, so a backlog of its own is not taken for silence.

A monitor short of CPU (12,500 heartbeats a second on a loaded host) handles each heartbeat later than it
arrived. A steady delay is harmless: each node is still heard once an interval. A *growing* one is not: the
heartbeats a node sent meanwhile wait unread, the node looks silent, and a healthy machine is flagged
unreachable. ``liveness`` therefore judges silence as of what the monitor has read up to: ``now`` minus
``behind_s``.

The delay of one heartbeat is ``received - sent``, ``sent`` on the node's clock. Each node's clock differs
from the monitor's by a constant (NTP keeps it steady), so what counts is the delay beyond the least one
seen from that node: the *excess*. The least is kept over two windows of ``window_s`` (rotated), so a step of
either clock is forgotten within two windows instead of skewing the figure for ever. ``behind_s`` is the
median excess of the heartbeats handled since it was last asked (the last ``sample`` of them): a backlog
delays every node's heartbeats alike, a node with a wrong clock is one outlier. Pure; ``note`` costs a few
dictionary operations per heartbeat.
"""

from __future__ import annotations

import math
from collections import deque

#: The least delay per node is kept over this many seconds (two windows).
WINDOW_S = 60.0
#: The most recent heartbeats the median is taken over (at 2,500 a second, the last ~0.1 s).
SAMPLE = 255


class ReadLag:
    def __init__(self, *, window_s: float = WINDOW_S, sample: int = SAMPLE) -> None:
        self.window_s = window_s
        self._least: dict[str, float] = {}  # node -> least delay seen in the current window
        self._before: dict[str, float] = {}  # the same over the previous window
        self._window_start: float | None = None
        self._excess: deque[float] = deque(maxlen=sample)
        self._behind = 0.0

    def note(self, node_id: str, sent: float, received: float) -> None:
        """One heartbeat handled at ``received`` (the monitor's clock), sent at ``sent`` (the node's)."""
        if self._window_start is None:
            self._window_start = received
        elif received - self._window_start >= self.window_s:
            self._before, self._least = self._least, {}
            self._window_start = received
        delay = received - sent
        least = self._least.get(node_id, math.inf)
        if delay < least:
            self._least[node_id] = least = delay
        least = min(least, self._before.get(node_id, math.inf))
        self._excess.append(delay - least)

    def behind_s(self) -> float:
        """The median excess delay of the heartbeats handled since the last call (the last figure when
        none was; 0 before any)."""
        if self._excess:
            ordered = sorted(self._excess)
            self._excess.clear()
            self._behind = ordered[len(ordered) // 2]
        return self._behind
