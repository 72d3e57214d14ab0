"""The collector of a service process whose fold is most of its heap.

A fold at 12,500 nodes is ~150,000 long-lived objects (a view per node and per job, their GPUs and
placements) that reference counting never frees and the cyclic collector never finds garbage in. With
the interpreter's defaults every follower paid for them on every event it folded: a young collection every
700 allocations (a few events) and, as jobs accumulated, full collections of the whole heap (~100 ms each
at 12,500 nodes); 3.3 of the 12.6 us a job event cost to decode and fold, measured over a recorded log.
``settle_heap`` collects once the fold has caught up, freezes what is left out of every later collection
(``gc.freeze``: it is never garbage) and collects young objects every 50,000 allocations: 9 us an event.
Cyclic garbage is still collected, only later.

Only a service's own process settles (``own_heap``, which ``run_service`` calls): a test that runs a
service in its own process's loop must not freeze the test runner's heap. The API and the scheduler settle
theirs the same way (services/api/fold.py; the scheduler also pauses the collector during its cycles,
services/scheduler/heap.py).
"""

from __future__ import annotations

import gc

#: Allocations between two young collections (the interpreter's default is 700).
YOUNG_THRESHOLD = 50_000

_owned = False


def own_heap() -> None:
    """This process is one service's own: its follower may settle the heap (``run_service`` calls it)."""
    global _owned
    _owned = True


def settle_heap() -> bool:
    """In a service's own process, collect once, freeze what is left and collect young objects less often;
    elsewhere nothing. True when it settled."""
    if not _owned:
        return False
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return True
