"""The scheduler's collector: paused through a cycle, tidied (collected, then frozen) when idle.

Each check runs in a child process: freezing and thresholds change a process's collector for good.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from rallypoint_services.scheduler.heap import CATCH_UP_AFTER, IdleTidy, collector_paused, settle_heap

out = {}
settle_heap()
frozen_at_settle = gc.get_freeze_count()

# Paused inside, restored after, nesting leaves it to the outermost.
with collector_paused():
    out["inside"] = gc.isenabled()
    with collector_paused():
        pass
    out["after_inner"] = gc.isenabled()
out["after"] = gc.isenabled()

# No young collection inside a pause however much is allocated; one on the way out past CATCH_UP_AFTER.
keep = []
def runs():
    return sum(g["collections"] for g in gc.get_stats())
runs_before = runs()
with collector_paused():
    keep.extend([i] for i in range(CATCH_UP_AFTER + 10_000))
    out["collected_inside"] = runs() - runs_before
out["collected_on_exit"] = runs() - runs_before
out["young_after_exit"] = gc.get_count()[0]

# Idle: a tidy collects cyclic garbage, freezes the survivors, and does nothing when nothing was made.
now = [0.0]
tidy = IdleTidy(full_every_s=600.0, clock=lambda: now[0])
class Cycle:
    pass
for _ in range(5_000):
    a, b = Cycle(), Cycle()
    a.other, b.other = b, a  # cyclic garbage: only the collector frees it
garbage = weakref.ref(a)
del a, b
survivors = [[i] for i in range(5_000)]
out["tidied"] = tidy()
out["garbage_freed"] = garbage() is None
out["frozen_grew_by"] = gc.get_freeze_count() - frozen_at_settle
out["young_after_tidy"] = gc.get_count()[0]
out["tidied_again_at_once"] = tidy()

# After full_every_s, everything is unfrozen and collected before freezing again.
now[0] = 601.0
keep.extend([i] for i in range(3_000))
before_unfreeze = gc.get_freeze_count()
out["tidied_full"] = tidy()
out["frozen_after_full"] = gc.get_freeze_count() >= before_unfreeze
print(json.dumps(out))
"""


def test_collector_paused_through_a_cycle_and_tidied_when_idle() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["inside"] is False and out["after_inner"] is False and out["after"] is True
    assert out["collected_inside"] == 0
    assert out["collected_on_exit"] >= 1 and out["young_after_exit"] < 1_000
    assert out["tidied"] is True and out["garbage_freed"] is True
    assert out["frozen_grew_by"] >= 5_000  # the survivors, now out of every collection
    assert out["young_after_tidy"] < 100
    assert out["tidied_again_at_once"] is False
    assert out["tidied_full"] is True and out["frozen_after_full"] is True
