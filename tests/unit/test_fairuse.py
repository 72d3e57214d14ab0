"""Fair use, pure parts: the token bucket on an injected clock, the queue file's fair-use keys (inherited
from orgs, refused with the key named when bad), the priority classes a team is granted (production
reserved), and the admission ledger's pending cap over a real fold."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from rallypoint_services.api.fairuse import PENDING_RETRY_AFTER_S, FairUse, TokenBucket, refusal_metrics

from rallypoint.events import JobCancelRequested, JobSpec, JobSubmitted
from rallypoint.scheduling.queues import QueuesError, TeamLimits, queues_from_obj
from rallypoint.security.tokens import Principal
from rallypoint.state import ClusterState

NLP = Principal(user="alice", team="nlp", admin=False, token_id="t-1")
ADMIN = Principal(user="ops", team=None, admin=True, token_id="t-0")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the token bucket -----------------------------------------------------------------------------------


def test_a_full_bucket_gives_its_burst_then_says_when_the_next_token_comes() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # nothing taken: asking again gives the same answer
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) == pytest.approx(0.5)


def test_a_bucket_refills_at_its_rate_up_to_its_burst_only() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=2, now=0.0)
    bucket.take(0.0), bucket.take(0.0)
    # an hour idle refills two tokens, not 3,600
    assert [bucket.take(3600.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]


def test_a_clock_stepping_back_adds_no_token() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=1, now=10.0)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(5.0) == pytest.approx(1.0)
    assert bucket.take(6.0) == 0.0


# --- the queue file's keys --------------------------------------------------------------------------------


def test_limits_are_inherited_from_the_nearest_org_that_sets_them() -> None:
    q = queues_from_obj(
        {
            "orgs": [
                {"name": "research", "max_pending_jobs": 50, "submissions_per_minute": 120},
                {"name": "language", "parent": "research", "max_pending_jobs": 20},
            ],
            "teams": [
                {"name": "nlp", "parent": "language", "submission_burst": 5},
                {
                    "name": "vision",
                    "parent": "research",
                    "max_pending_jobs": 80,
                    "submissions_per_minute": 30,
                },
                {"name": "infra"},
            ],
        }
    )
    assert q.limits("nlp") == TeamLimits(max_pending_jobs=20, submissions_per_minute=120, burst=5)
    # the burst defaults to a minute's worth
    assert q.limits("vision") == TeamLimits(max_pending_jobs=80, submissions_per_minute=30, burst=30)
    assert q.limits("infra") == TeamLimits(max_pending_jobs=None, submissions_per_minute=None, burst=1)
    assert q.limits("unlisted") == q.limits("infra")


def team(**keys: Any) -> dict[str, Any]:
    return {"teams": [{"name": "nlp", **keys}]}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (team(max_pending_jobs=0), "team nlp: max_pending_jobs must be > 0, got 0"),
        (team(submissions_per_minute=-1), "team nlp: submissions_per_minute must be > 0, got -1"),
        (team(submissions_per_minute=10, submission_burst=0), "team nlp: submission_burst must be > 0"),
        (team(submission_burst=10), "team nlp: submission_burst without submissions_per_minute"),
        (team(max_pending_jobs="many"), "at `$.teams[0].max_pending_jobs`"),
        (team(submission_burst=1.5), "at `$.teams[0].submission_burst`"),
        (team(priorities="production"), "at `$.teams[0].priorities`"),
        (team(priorities=[]), "team nlp: priorities must name at least one class"),
        (team(priorities=["urgent"]), "team nlp: priorities names 'urgent', which is not a priority class"),
        (team(priorities=["development", "development"]), "team nlp: priorities lists a class twice"),
        ({"orgs": [{"name": "r", "max_pending_jobs": -3}]}, "org r: max_pending_jobs must be > 0"),
        ({"orgs": [{"name": "r", "priorities": ["x"]}]}, "org r: priorities names 'x'"),
        ({"teams": [{"name": "nlp", "max_pending_job": 3}]}, "unknown field `max_pending_job`"),
    ],
)
def test_a_bad_limit_is_refused_naming_its_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(QueuesError, match=r"^<queues>: ") as caught:
        queues_from_obj(config)
    assert message in str(caught.value)


# --- the priority classes a team may use ------------------------------------------------------------------

EVERY_CLASS_BUT_PRODUCTION = [
    "training-high",
    "interactive",
    "training-standard",
    "development",
    "best-effort",
]


def test_production_is_reserved_unless_granted() -> None:
    q = queues_from_obj(
        {
            "orgs": [{"name": "ops", "priorities": ["production", "best-effort"]}],
            "teams": [
                {"name": "nlp"},
                {"name": "serving", "parent": "ops"},
                {"name": "oncall", "priorities": ["production", "training-high"]},
                {"name": "legacy", "max_priority": "production"},
                {
                    "name": "capped",
                    "max_priority": "development",
                    "priorities": ["best-effort", "training-high"],
                },
            ],
        }
    )
    assert q.granted_priorities("nlp") == EVERY_CLASS_BUT_PRODUCTION
    assert q.granted_priorities("unlisted") == EVERY_CLASS_BUT_PRODUCTION
    assert q.granted_priorities("serving") == ["production", "best-effort"]
    assert q.granted_priorities("oncall") == ["production", "training-high"]
    # an explicit ceiling grants every class up to it: a file that wrote max_priority: production meant it
    assert q.granted_priorities("legacy")[0] == "production"
    assert q.priority_refusal("legacy", "production") is None

    refusal = q.priority_refusal("nlp", "production")
    assert refusal == (
        "team 'nlp' may not submit at priority 'production' (reserved; the queue file must grant it); "
        f"its classes: {', '.join(EVERY_CLASS_BUT_PRODUCTION)}"
    )
    assert "(not granted)" in str(q.priority_refusal("serving", "development"))
    assert q.priority_refusal("serving", "production") is None
    # both apply: the ceiling refuses training-high, the list refuses development
    assert "or below" in str(q.priority_refusal("capped", "training-high"))
    assert "(not granted)" in str(q.priority_refusal("capped", "development"))
    assert q.priority_refusal("capped", "best-effort") is None


def test_a_file_with_classes_of_its_own_and_no_production_grants_them_all() -> None:
    q = queues_from_obj({"priority_classes": [{"name": "urgent", "value": 9}, {"name": "batch", "value": 1}],
                         "default_priority": "batch"})  # fmt: skip
    assert q.granted_priorities("anyone") == ["urgent", "batch"]


# --- the admission ledger -----------------------------------------------------------------------------------


def pending_state(*teams: str) -> ClusterState:
    """A fold holding one pending job per entry of ``teams``, applied as the API's fold applies them."""
    state = ClusterState()
    for seq, name in enumerate(teams, start=1):
        spec = JobSpec(
            name=f"j{seq}", team=name, gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",)
        )
        state.apply(seq, JobSubmitted(job_id=f"j-{seq:012d}", spec=spec, submitted_at=1.0))
    return state


def test_the_pending_cap_counts_the_fold_and_admissions_it_has_not_applied() -> None:
    clock = Clock()
    fair = FairUse(queues_from_obj(team(max_pending_jobs=3)), clock)
    state = pending_state("nlp", "vision", "vision")
    assert fair.admit(NLP, "nlp", "j-a", state) is None
    assert fair.admit(NLP, "nlp", "j-b", state) is None
    refusal = fair.admit(NLP, "nlp", "j-c", state)
    assert refusal is not None and refusal.limit == "max_pending_jobs"
    assert refusal.retry_after_s == PENDING_RETRY_AFTER_S
    assert "has 3 jobs waiting, its max_pending_jobs is 3" in refusal.detail

    # an append the log refused made no job: its slot is free again
    fair.withdraw("j-b")
    assert fair.admit(NLP, "nlp", "j-c", state) is None
    # a cancel leaves the queue: the fold no longer counts the job
    state.apply(4, JobCancelRequested(job_id="j-000000000001", at=2.0))
    assert fair.admit(NLP, "nlp", "j-d", state) is None
    assert fair.refusals == {("nlp", "max_pending_jobs"): 1}


def test_an_admission_the_fold_shows_is_counted_once() -> None:
    fair = FairUse(queues_from_obj(team(max_pending_jobs=2)), Clock())
    state = pending_state()
    assert fair.admit(NLP, "nlp", "j-000000000001", state) is None
    state = pending_state("nlp")  # the fold applied it: the fold counts it, the ledger forgets it
    assert fair.admit(NLP, "nlp", "j-b", state) is None
    assert fair.admit(NLP, "nlp", "j-c", state) is not None


def test_the_rate_refuses_with_the_seconds_to_wait_and_admins_are_not_limited() -> None:
    clock = Clock()
    fair = FairUse(queues_from_obj(team(submissions_per_minute=6, submission_burst=2)), clock)
    state = ClusterState()
    assert fair.admit(NLP, "nlp", "j-1", state) is None
    assert fair.admit(NLP, "nlp", "j-2", state) is None
    refusal = fair.admit(NLP, "nlp", "j-3", state)
    assert refusal is not None and refusal.limit == "submissions_per_minute"
    assert refusal.retry_after_s == 10  # six a minute: one every ten seconds
    assert all(fair.admit(ADMIN, "nlp", f"j-admin-{i}", state) is None for i in range(50))
    clock.now += 10.0
    assert fair.admit(NLP, "nlp", "j-3", state) is None
    # rate-only teams keep no admissions (nothing would ever forget them)
    assert fair.admitted == {}


def test_refusals_are_a_counter_by_team_and_limit() -> None:
    text = refusal_metrics(Counter({("nlp", "priority"): 2, ("nlp", "submissions_per_minute"): 7}))
    assert 'rally_api_fair_use_refusals_total{team="nlp",limit="submissions_per_minute"} 7' in text
    assert "# TYPE rally_api_fair_use_refusals_total counter" in text
