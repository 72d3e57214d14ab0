"""The short chaos run on the production shape (issue 34): a three-server JetStream cluster (R3 stream and
buckets) and two replicas of every service. One round of its faults, each kind once in an order drawn from
the seed: kill -9 of a nats-server, of a service replica, of a replica and a server together, a node frozen
past the lost timeout (the trickle has two-node gangs, so one needs a repair), an agent's kill, a paused
replica, a poison message and a forged bind. After every step nothing acknowledged is lost, nothing is
written twice, PostgreSQL equals the log; at the end every job ended as it should and the audit passes
(see ``monkey``). `make chaos` runs the same shape for 30 minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .monkey import REPLICATED_FAULTS, run_chaos

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RALLY_CHAOS_SEED", "3"))


def test_three_servers_and_two_replicas_of_everything_lose_nothing_and_do_nothing_twice(
    tmp_path: Path,
) -> None:
    result = run_chaos(
        tmp_path / "chaos", seed=SEED, steps=len(REPLICATED_FAULTS), drain_s=150, nats_servers=3, replicas=2
    )
    print("\n" + result.table())
    assert {step.fault for step in result.steps} == set(REPLICATED_FAULTS)
    assert any(job.kind == "gang" for job in result.jobs.values()), "no two-node gang met the faults"
    assert result.ok, result.table()
