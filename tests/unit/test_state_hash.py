"""``ClusterState.hash`` is computed in pieces (``canonical_pieces``) so a snapshot's save can give its event
loop back while it hashes; the bytes must stay those of the one-shot canonical encoding that recorded
hashes (``rally replay``, the audit, SnapshotTaken records) were made with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec

from rallypoint.events import Event, JobSpec, JobSubmitted
from rallypoint.events.synthetic import job_life, node_name, registered_node
from rallypoint.state import ClusterState
from rallypoint.userusage import UserLedger, start_attempt

HISTORY = Path(__file__).parents[1] / "replay" / "data" / "history.jsonl"


def one_shot_hash(state: ClusterState) -> str:
    """The definition the recorded hashes were made with: the whole state at once."""
    canonical = msgspec.to_builtins(state, str_keys=True)
    for job in canonical["jobs"].values():
        if job["resize"] is None:
            del job["resize"]
        if job["user"] is None:
            del job["user"]
    if not canonical["users"]:
        del canonical["users"]
    _without_sums_by_day(canonical)
    return hashlib.sha256(msgspec.json.encode(canonical, order="deterministic")).hexdigest()


def test_the_pieces_hash_as_the_whole_at_every_position_of_the_recorded_history() -> None:
    state = ClusterState()
    assert state.hash() == one_shot_hash(state)
    for line in HISTORY.read_text().splitlines():
        item = json.loads(line)
        state.apply(item["seq"], msgspec.json.decode(json.dumps(item["event"]), type=Event))
        assert state.hash() == one_shot_hash(state), item["seq"]


def test_keys_sort_as_the_canonical_encoding_sorts_them_users_included() -> None:
    state = ClusterState()
    seq = 0
    for i, name in enumerate(("zeta", "Zeta", "été", "a-1", "a_1", "🙂", "a")):
        node = registered_node(i, at=0.0)
        state.apply(seq := seq + 1, msgspec.structs.replace(node, node_id=name))
    for job_id in ("job-b", "Job-a", "jöb", "job-10", "job-9"):
        spec = JobSpec(name=job_id, team="t", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
        state.apply(seq := seq + 1, JobSubmitted(job_id=job_id, spec=spec, submitted_at=1.0))
    for phase in job_life("ran", node_id=node_name(0), gpus=(0,), ranks=1, at=2.0, run_s=5.0):
        for event in phase:
            state.apply(seq := seq + 1, event)
    state.users = {"t": {"bob": UserLedger(days={12: 4, 3: 100}), "ålice": UserLedger()}}
    start_attempt(state.users["t"]["bob"], "job-9", 3.5, 2)  # summed by start day: not in the hash
    assert state.users["t"]["bob"].by_day
    assert state.hash() == one_shot_hash(state)
    assert b"".join(state.canonical_pieces()) == msgspec.json.encode(
        _without_hash_exceptions(state), order="deterministic"
    )


def _without_hash_exceptions(state: ClusterState) -> dict[str, object]:
    canonical = msgspec.to_builtins(state, str_keys=True)
    for job in canonical["jobs"].values():
        for field in ("resize", "user"):
            if job[field] is None:
                del job[field]
    _without_sums_by_day(canonical)
    return canonical


def _without_sums_by_day(canonical: dict[str, object]) -> None:
    """Each user's running attempts summed by start day came after the first recorded hashes, and
    ``running`` determines them: hashes leave them out."""
    users = canonical.get("users", {})
    assert isinstance(users, dict)
    for ledgers in users.values():
        for ledger in ledgers.values():
            del ledger["by_day"]
