"""The scheduler process's garbage collector, set for a large, long-lived heap and short cycles.

The fold holds tens of thousands of long-lived objects (a view per node and per job, their GPUs and
placements) that reference counting never frees and the cyclic collector never finds garbage in. With
the interpreter's defaults (a young collection every 700 allocations, a full one whenever the heap grew
by a quarter), a burst of thousands of binds triggered full collections of that whole heap in the middle
of cycles: 40-75 ms each, ~0.5 s of every 2 s of a 2,500-job burst measured in the binds harness.

``settle_heap`` is called once the fold has caught up: what exists then is frozen out of every
collection (``gc.freeze``: never garbage), and young collections run every 50,000 allocations, so a
cycle (whose core already pauses the collector) and the fold between cycles are rarely interrupted.
Cyclic garbage is still collected, only later.
"""

from __future__ import annotations

import gc

#: Allocations between two young collections (the interpreter's default is 700).
YOUNG_THRESHOLD = 50_000


def settle_heap() -> None:
    """Collect once, freeze what is left (the caught-up fold), and collect young objects less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
