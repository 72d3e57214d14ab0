"""``runtime.heap``: a service's own process settles its collector once its fold has caught up; any other
process (a test running a service in its own loop) is left as it was. Run in child interpreters, so this
test's own collector is never touched."""

from __future__ import annotations

import json
import subprocess
import sys

from rallypoint.runtime.heap import YOUNG_THRESHOLD

_PROBE = """
import gc, json, sys
from rallypoint.runtime import heap
if sys.argv[1] == "own":
    heap.own_heap()
before = gc.get_threshold()[0]
settled = heap.settle_heap()
print(json.dumps([settled, before, gc.get_threshold()[0], gc.get_freeze_count()]))
"""


def _probe(mode: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    answer: list[int] = json.loads(done.stdout)
    return answer


def test_a_service_process_settles_its_heap() -> None:
    settled, before, after, frozen = _probe("own")
    assert settled and before != YOUNG_THRESHOLD
    assert after == YOUNG_THRESHOLD
    assert frozen > 0  # the objects alive then are out of every later collection


def test_any_other_process_is_left_as_it_was() -> None:
    settled, before, after, frozen = _probe("other")
    assert not settled
    assert after == before
    assert frozen == 0
