"""The scheduler process's garbage collector, set for a large, long-lived heap and short cycles.

The fold holds tens of thousands of long-lived objects (a view per node and per job, their GPUs and
placements) that reference counting never frees and the cyclic collector never finds garbage in. With
the interpreter's defaults (a young collection every 700 allocations, a full one whenever the heap grew
by a quarter), a burst of thousands of binds triggered full collections of that whole heap in the middle
of cycles: 40-75 ms each, ~0.5 s of every 2 s of a 2,500-job burst measured in the binds harness.

``settle_heap`` is called once the fold has caught up: what exists then is frozen out of every
collection (``gc.freeze``: never garbage), and young collections run every 50,000 allocations. That
alone still left collections on the critical path of a burst: nodes registered and jobs folded after
the settle are scanned again by every full collection (131 ms at 12,500 nodes in ``rally bench
cluster``), and a young collection of 50,000 objects took 24-125 ms on the shared 2 cores, in the
middle of the cycle that answers a burst of capacity. They found 0-22 objects to free each time. So:

- a cycle runs with the collector paused (``collector_paused``), from the fold it decides on to its
  writes stored; what the collection would have done waits until the binds are in the log;
- when the loop is idle (a tick without a change), ``IdleTidy`` collects and freezes what survived, so
  the next burst starts with an empty young generation and a full collection has little left to scan.
  Every ``full_every_s`` it unfreezes everything first, so cyclic garbage among frozen objects (none is
  known in the fold) is still found eventually.

Cyclic garbage is still collected, only later and off the critical path.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator

#: Allocations between two young collections (the interpreter's default is 700).
YOUNG_THRESHOLD = 50_000
#: Tracked objects allocated (net) since the last collection above which a paused cycle's end collects
#: the young generations at once: a burst of back-to-back cycles never leaves the collector a moment
#: unpaused, and the young generation must not grow without bound meanwhile.
CATCH_UP_AFTER = 400_000
#: An idle loop tidies only when this much (net) was allocated since the last collection, or when a
#: collection ran since: an idle tick allocates a few hundred objects.
IDLE_MIN = 2_000


def settle_heap() -> None:
    """Collect once, freeze what is left (the caught-up fold), and collect young objects less often."""
    _collect_and_freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside: a cycle's compute and writes are not interrupted. On the way out a
    young generation grown past ``CATCH_UP_AFTER`` is collected at once (nested pauses leave it to the
    outermost)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            if gc.get_count()[0] > CATCH_UP_AFTER:
                gc.collect(1)


class IdleTidy:
    """Called when the loop had nothing to do for a tick: collect, then freeze the survivors."""

    def __init__(self, *, full_every_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every_s = full_every_s
        self.clock = clock
        self._last_full = clock()
        self.tidied = 0  # how many times it collected (a test reads it)

    def __call__(self) -> bool:
        """True when it collected."""
        young, gen0_runs, gen1_runs = gc.get_count()
        if young < IDLE_MIN and gen0_runs == 0 and gen1_runs == 0:
            return False
        if self.clock() - self._last_full >= self.full_every_s:
            gc.unfreeze()
            self._last_full = self.clock()
        _collect_and_freeze()
        self.tidied += 1
        return True


def _collect_and_freeze() -> None:
    """Free what is garbage now, then take every survivor out of all later collections."""
    gc.collect()
    gc.freeze()
