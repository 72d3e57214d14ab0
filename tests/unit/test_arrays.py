"""Job arrays (issue 35, Build item 2): the index expression, the members, their limit on the fold, and what
each member's ranks are told."""

from __future__ import annotations

import pytest
from test_dependencies import Fold

from rallypoint.control.reconcile import Launch, reconcile
from rallypoint.events import ArrayMember, JobCancelRequested, JobCompleted, JobSpec
from rallypoint.jobs.arrays import ArrayRequest, array_env, members, parse_array
from rallypoint.jobs.validate import SpecError

SPEC = JobSpec(name="sweep", team="nlp", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("x",))


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-4", (0, 1, 2, 3, 4), None),
        ("0-99%8", tuple(range(100)), 8),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-30:10%1", (0, 10, 20, 30), 1),
        ("7,7,2", (2, 7), None),
    ],
)
def test_an_index_expression_gives_its_indices_and_limit(
    text: str, indices: tuple[int, ...], limit: int | None
) -> None:
    assert parse_array(text) == ArrayRequest(indices, limit)


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("", "must be an index expression"),
        (5, "must be an index expression"),
        ("a-b", "is not an index, a range"),
        ("5-1", "need A <= B"),
        ("0-9:0", "a step >= 1"),
        ("0-1000", "at most 1000 members"),
        ("0-500,600-1100", "at most 1000 members"),
        ("0-9%0", "whole number >= 1"),
        ("0-9%x", "whole number >= 1"),
        ("1, 2", "is not an index"),
    ],
)
def test_a_bad_index_expression_is_refused_naming_array(text: object, detail: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_array(text)
    assert err.value.field == "array" and detail in err.value.detail


def test_members_carry_the_array_and_their_index() -> None:
    got = members("j-abc", SPEC, parse_array("3,5%1"))
    assert [job_id for job_id, _ in got] == ["j-abc_3", "j-abc_5"]
    assert got[1][1].array == ArrayMember(array_id="j-abc", index=5, count=2, max_running=1)
    assert array_env(got[1][1]) == {
        "RALLY_ARRAY_ID": "j-abc",
        "RALLY_ARRAY_INDEX": "5",
        "RALLY_ARRAY_COUNT": "2",
    }
    assert array_env(SPEC) == {}


def _array(fold: Fold, text: str) -> list[str]:
    ids = []
    for job_id, spec in members("arr", SPEC, parse_array(text)):
        fold.submit(job_id, spec)
        ids.append(job_id)
    return ids


def test_at_most_the_limit_hold_gpus_the_rest_wait_in_index_order() -> None:
    fold = Fold()
    ids = _array(fold, "0-4%2")
    assert fold.ready() == ids[:2]
    assert fold.state.hold_of(fold.state.jobs[ids[2]]) == "array limit: 0 of its 2 members at once hold GPUs"
    fold.start(ids[0])
    fold.start(ids[1])
    assert fold.ready() == []
    assert set(fold.state.held_jobs()) == set(ids[2:])
    assert fold.state.hold_of(fold.state.jobs[ids[4]]) == "array limit: 2 of its 2 members at once hold GPUs"
    fold.apply(JobCompleted(job_id=ids[0], attempt=1, at=3.0))
    assert fold.ready() == [ids[2]]  # one slot free: the next index
    fold.apply(JobCancelRequested(job_id=ids[2], at=4.0))
    assert fold.ready() == [ids[3]]  # a cancelled member takes no slot


def test_an_array_without_a_limit_is_not_held() -> None:
    fold = Fold()
    ids = _array(fold, "0-3")
    assert fold.ready() == ids and fold.state.held_jobs() == {}


def test_a_bound_member_is_launched_with_its_index() -> None:
    fold = Fold()
    ids = _array(fold, "4-5")
    fold.start(ids[1], started=False)
    actions = reconcile(fold.state.jobs[ids[1]], fold.state, 5.0)
    [launch] = [a for a in actions if isinstance(a, Launch)]
    env = launch.tasks[0].env
    assert (env["RALLY_ARRAY_ID"], env["RALLY_ARRAY_INDEX"], env["RALLY_ARRAY_COUNT"]) == ("arr", "5", "2")
