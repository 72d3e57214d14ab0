"""A short seeded chaos run in `make test` (`make chaos` runs a long one): faults under a trickle of jobs,
checked after every step (see ``monkey``). The seed is printed; ``RALLY_CHAOS_SEED`` reruns one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .monkey import run_chaos

pytestmark = pytest.mark.slow

#: Seed 7 draws every kind of fault in 10 steps (nats-server killed twice, a node frozen past the lost
#: timeout), ~60 s.
SEED = int(os.environ.get("RALLY_CHAOS_SEED", "7"))


def test_a_short_chaos_run_loses_no_job_binds_no_gpu_twice_and_replays_to_the_live_hash(
    tmp_path: Path,
) -> None:
    result = run_chaos(tmp_path / "chaos", seed=SEED, steps=10, drain_s=90)
    print("\n" + result.table())
    assert result.ok, result.table()
