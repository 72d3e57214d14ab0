"""Fair share between a team's users, outside the core: the fold's usage ledgers, the bridge's rows, the
queue file's ``users`` weights and ``rally queues``."""

from __future__ import annotations

import json

import msgspec
import pytest
from rallypoint_services.api.dryrun import DryRuns

from rallypoint.accounting import queues_report
from rallypoint.cli.account_format import format_queues
from rallypoint.events import (
    GangBound,
    GpuInfo,
    JobCompleted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.projection.rows import ReadModel
from rallypoint.scheduling import build_snapshot
from rallypoint.scheduling.config import core_queues
from rallypoint.scheduling.queues import QueuesError, queues_from_obj
from rallypoint.state import ClusterState
from rallypoint.userusage import UserLedger, UserUsage, running_rows, start_attempt


def _node() -> NodeRegistered:
    gpus = tuple(GpuInfo(index=i, uuid=f"g{i}", memory_mib=80_000, nvlink_domain=0) for i in range(8))
    return NodeRegistered(
        node_id="n1",
        address="127.0.0.1",
        rack="r0",
        gpu_type="h100",
        gpus=gpus,
        cpu_milli=1000,
        memory_mib=1000,
        agent_instance="a",
        at=0.0,
    )


def _submit(job_id: str, user: str | None, gpus: int = 8, at: float = 1.0) -> JobSubmitted:
    spec = JobSpec(name=job_id, team="nlp", gpus=gpus, gpus_per_task=gpus, ranks_per_task=1, command=("x",))
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=at, submitted_by=user)


def _bind(job_id: str, at: float) -> GangBound:
    placement = TaskPlacement(task=0, node_id="n1", gpus=tuple(range(8)))
    return GangBound(
        job_id=job_id,
        attempt=1,
        epoch=1,
        placements=(placement,),
        computed_at_seq=0,
        policy_version="t",
        now=at,
        at=at,
    )


def fold() -> ClusterState:
    """alice ran 8 GPUs for 100 s and runs again since t=200; bob and carol wait, bob has used nothing."""
    state = ClusterState()
    events = [
        _node(),
        LeaderEpochStarted(epoch=1, leader_id="l", role="scheduler", at=0.0),
        _submit("a1", "alice"),
        _bind("a1", 10.0),
        JobStarted(job_id="a1", attempt=1, at=10.0),
        JobCompleted(job_id="a1", attempt=1, at=110.0),
        _submit("a2", "alice", at=150.0),
        _bind("a2", 200.0),
        JobStarted(job_id="a2", attempt=1, at=200.0),
        _submit("b1", "bob", at=210.0),
        _submit("a3", "alice", at=220.0),
        _submit("x1", None, at=230.0),
    ]
    for seq, event in enumerate(events, 1):
        state.apply(seq, event)
    return state


def test_the_fold_bills_each_users_attempts_and_the_bridge_hands_the_waiting_users_rows() -> None:
    state = fold()
    ledger = state.users["nlp"]["alice"]
    assert ledger.days == {0: 800} and ledger.running == {"a2": (200.0, 8)}
    snap = build_snapshot(state, 300.0)
    assert {p.id: p.user for p in snap.pending} == {"b1": "bob", "a3": "alice", "x1": None}
    # only alice has any usage: bob's row would be empty
    assert snap.user_usage == (
        UserUsage(team="nlp", user="alice", days=((0, 800),), running=running_rows([(200.0, 8)])),
    )


def test_users_leave_the_hash_of_a_log_without_them_unchanged() -> None:
    with_users, without = ClusterState(), ClusterState()
    for seq, event in enumerate([_node(), _submit("j", None)], 1):
        without.apply(seq, event)
    # the hash of a log without users is what it was before users existed: no "user", no "users"
    canonical = msgspec.to_builtins(without, str_keys=True)
    assert canonical["users"] == {} and canonical["jobs"]["j"]["user"] is None
    for seq, event in enumerate([_node(), _submit("j", "alice")], 1):
        with_users.apply(seq, event)
    assert with_users.hash() != without.hash()
    again = ClusterState.decode(with_users.encode())
    assert again.hash() == with_users.hash() and again.jobs["j"].user == "alice"


def test_queue_file_user_weights_reach_the_core() -> None:
    q = queues_from_obj({"teams": [{"name": "nlp", "nominal": 8, "users": {"alice": 2, "bob": 0.5}}]})
    (team,), _ = core_queues(q)
    assert team.user_weights == (("alice", 2.0), ("bob", 0.5))


@pytest.mark.parametrize(
    ("users", "names"),
    [
        ({"alice": 0}, "users.alice"),
        ({"alice": -1}, "users.alice"),
        ({"alice": "heavy"}, "users"),  # msgspec names the mapping
        ({"alice": float("inf")}, "users.alice"),
    ],
)
def test_bad_user_weights_are_refused_naming_the_field(users: dict, names: str) -> None:
    with pytest.raises(QueuesError, match=names.replace(".", r"\.")):
        queues_from_obj({"teams": [{"name": "nlp", "users": users}]}, "q.yaml")


def test_rally_queues_lists_each_teams_users() -> None:
    state = fold()
    q = queues_from_obj({"teams": [{"name": "nlp", "nominal": 8, "users": {"alice": 2}}]})
    report = queues_report(state, q, now=300.0)
    (row,) = report.teams
    assert [(u.user, u.weight, u.usage_gpu_h, u.running_gpus, u.pending_jobs) for u in row.users] == [
        ("bob", 1.0, 0.0, 0, 1),
        ("alice", 2.0, round((800 + 8 * 100) / 3600, 2), 8, 1),
    ]
    body = json.loads(msgspec.json.encode(report))
    assert body["teams"][0]["users"][1]["user"] == "alice"
    text = format_queues(body)
    assert "USER" in text and "USAGE-GPU-H" in text
    alice = next(line for line in text.splitlines() if " alice " in f" {line} ")
    assert alice.split()[:4] == ["nlp", "alice", "2", "0.44"]
    # no users at all: no users table
    bare = queues_report(ClusterState(), None, now=0.0)
    assert "USER" not in format_queues(json.loads(msgspec.json.encode(bare)))


def test_a_dry_run_weighs_the_callers_usage_as_a_submit_would() -> None:
    state = fold()  # the node is full: every waiting job waits, in the policy's order
    runs = DryRuns(queues=None)
    spec = JobSpec(name="try", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("x",))

    def ahead(user: str | None) -> int | None:
        answer = runs.judge(state, spec, job_id=None, refused=None, now=300.0, user=user)
        assert answer.reason is not None
        return answer.reason.jobs_ahead

    # users without usage (bob, no user) first by submission: b1, x1; then alice's a3 (she used GPUs)
    assert ahead("bob") == 2
    assert ahead("alice") == 3  # behind her own earlier a3 too


def test_a_user_running_a_whole_large_cluster_in_one_day_still_snapshots_and_projects() -> None:
    """The sums by start day must fit a snapshot's 64-bit integers (msgpack): seconds since the epoch in
    2^-20 s units overflowed them past ~10,000 GPUs started in one day, and the projector, which encodes
    its model at every commit, stopped."""
    state = ClusterState()
    ledger = state.users.setdefault("nlp", {}).setdefault("alice", UserLedger())
    day_start = 20_430 * 86_400.0  # 2025-12-08, as a live cluster's clock reads
    for i in range(25_000):  # 200,000 GPUs, the last a second before the day ends
        start_attempt(ledger, f"j{i}", day_start + 86_399.0 * i / 24_999, 8)
    restored = ClusterState.decode(state.encode())
    assert restored.users["nlp"]["alice"].by_day == ledger.by_day
    assert ReadModel.decode(ReadModel(state).encode()).state.users == state.users


def test_a_snapshot_from_before_the_sums_by_day_decodes_with_them_rebuilt_from_the_running_attempts() -> None:
    """``by_day`` is derived: a fold restored from a snapshot written before it existed (no such field), or
    holding sums that disagree, must read the same usage as the fold that replayed the log."""
    state = fold()
    ledger = state.users["nlp"]["alice"]
    assert ledger.by_day  # alice's a2 runs
    for sums in (None, {0: [1, 1], 7: [3, 9]}):
        snapshot = msgspec.to_builtins(msgspec.msgpack.decode(state.encode()))
        for user in snapshot[1]["users"]["nlp"].values():
            user.pop("by_day")
            if sums is not None:
                user["by_day"] = sums
        restored = ClusterState.decode(msgspec.msgpack.encode(snapshot))
        assert restored.users["nlp"]["alice"].by_day == ledger.by_day, sums
        assert build_snapshot(restored, 300.0).user_usage == build_snapshot(state, 300.0).user_usage
