"""The cluster bench's yardstick (``bench.reference``) folds what it claims: every job submitted, bound
and started, no bind refused (a refused bind costs a fold far less and would flatter the machine)."""

from __future__ import annotations

from rallypoint.bench.reference import BINDS_PER_CYCLE, _cluster, _fold, _jobs, fold_us_per_job
from rallypoint.state import ClusterState


def test_the_reference_log_binds_and_starts_every_job() -> None:
    jobs = 5 * BINDS_PER_CYCLE
    state = ClusterState()
    seq = _fold(state, _cluster(jobs // 8 + 1), 0)
    _fold(state, _jobs(jobs), seq)
    assert len(state.jobs) == jobs
    assert {job.state for job in state.jobs.values()} == {"running"}
    assert state.ignored_binds == 0 and state.orphans == 0 and state.quarantine.total == 0


def test_the_yardstick_is_a_positive_time_per_job() -> None:
    assert 0 < fold_us_per_job(2 * BINDS_PER_CYCLE) < 100_000
