"""Job dependencies and singletons on the fold (issue 35): when each kind is met or can never be, what the
scheduler is shown, and what the job controller does with a job that would wait forever."""

from __future__ import annotations

import pytest

from rallypoint.control.reconcile import Append, reconcile
from rallypoint.events import (
    Dependency,
    Event,
    GangBound,
    GpuInfo,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    LeaderEpochStarted,
    NodeRegistered,
    TaskPlacement,
)
from rallypoint.jobs.validate import SpecError, validate_spec
from rallypoint.sim.workload import WorkloadError, parse_lines
from rallypoint.state import ClusterState


def spec(name: str = "train", *, deps: tuple[Dependency, ...] = (), singleton: bool = False) -> JobSpec:
    return JobSpec(
        name=name,
        team="nlp",
        gpus=1,
        gpus_per_task=1,
        ranks_per_task=1,
        command=("x",),
        depends_on=deps,
        singleton=singleton,
    )


class Fold:
    def __init__(self) -> None:
        self.state = ClusterState()
        gpus = tuple(GpuInfo(index=i, uuid=f"g{i}", memory_mib=1, nvlink_domain=0) for i in range(8))
        self.apply(
            NodeRegistered(
                node_id="n0",
                address="h",
                rack="r",
                gpu_type="sim",
                gpus=gpus,
                cpu_milli=1,
                memory_mib=1,
                agent_instance="a",
                at=1.0,
            )
        )
        self.apply(LeaderEpochStarted(epoch=1, leader_id="s", at=1.0))  # binds are a leader's
        self.gpu = 0

    def apply(self, event: Event) -> None:
        self.state.apply(self.state.last_seq + 1, event)

    def submit(self, job_id: str, job_spec: JobSpec) -> None:
        self.apply(JobSubmitted(job_id=job_id, spec=job_spec, submitted_at=1.0))

    def start(self, job_id: str, *, started: bool = True) -> None:
        place = (TaskPlacement(task=0, node_id="n0", gpus=(self.gpu,)),)
        self.gpu += 1
        self.apply(
            GangBound(
                job_id=job_id,
                attempt=1,
                epoch=1,
                placements=place,
                computed_at_seq=0,
                policy_version="p",
                now=2.0,
                at=2.0,
            )
        )
        if started:
            self.apply(JobStarted(job_id=job_id, attempt=1, resume_step=None, at=2.0))

    def ready(self) -> list[str]:
        return [j.job_id for j in self.state.ready_jobs(10.0)]


@pytest.mark.parametrize(
    ("kind", "end", "met"),
    [
        ("after-ok", "completed", True),
        ("after-ok", "failed", False),
        ("after-not-ok", "failed", True),
        ("after-not-ok", "cancelled", True),
        ("after-not-ok", "completed", False),
        ("after-any", "failed", True),
        ("after-any", "completed", True),
    ],
)
def test_an_ended_dependency_releases_or_fails_its_job(kind: str, end: str, met: bool) -> None:
    fold = Fold()
    fold.submit("a", spec("prep"))
    fold.submit("b", spec(deps=(Dependency(kind=kind, job_id="a"),)))  # type: ignore[arg-type]
    assert fold.ready() == ["a"]
    assert fold.state.hold_of(fold.state.jobs["b"]) == f"waiting for a to {_WORD[kind]} ({kind})"
    assert fold.state.dependents_of("a") == {"b"}
    fold.start("a")
    assert fold.ready() == []  # a runs; b still waits
    ending: Event = {
        "completed": JobCompleted(job_id="a", attempt=1, at=3.0),
        "failed": JobFailed(job_id="a", attempt=1, reason="exit 1", exit_code=1, at=3.0),
        "cancelled": JobCancelled(job_id="a", attempt=1, at=3.0),
    }[end]
    fold.apply(ending)
    b = fold.state.jobs["b"]
    actions = reconcile(b, fold.state, 4.0)
    if met:
        assert fold.ready() == ["b"] and actions == []
        return
    assert fold.ready() == []
    assert len(actions) == 1 and isinstance(actions[0], Append)
    failed = actions[0].event
    assert isinstance(failed, JobFailed) and failed.attempt == 0
    assert failed.reason == f"dependency can never be met: a ended {end} ({kind})"
    fold.apply(failed)
    assert fold.state.jobs["b"].state == "failed" and fold.state.dependents_of("a") == frozenset()


_WORD = {"after-ok": "complete", "after-not-ok": "fail or be cancelled", "after-any": "end"}


def test_after_is_met_once_the_job_starts_and_never_if_it_ends_unstarted() -> None:
    fold = Fold()
    fold.submit("a", spec("server"))
    fold.submit("b", spec(deps=(Dependency(kind="after", job_id="a"),)))
    fold.submit("c", spec("other"))
    fold.submit("d", spec(deps=(Dependency(kind="after", job_id="c"),)))
    fold.start("a")
    assert fold.ready() == ["b", "c"]
    fold.apply(JobCancelled(job_id="c", attempt=None, at=3.0))
    d = fold.state.jobs["d"]
    never = "dependency can never be met: c ended cancelled without being placed (after)"
    assert fold.state.hold_of(d) == never
    assert reconcile(d, fold.state, 4.0) != []


def test_a_singleton_waits_for_every_earlier_live_job_of_its_name_and_team() -> None:
    fold = Fold()
    fold.submit("a", spec("nightly"))
    fold.submit("b", spec("nightly", singleton=True))
    fold.submit("c", spec("nightly", singleton=True))
    fold.submit("d", spec("other", singleton=True))
    assert fold.ready() == ["a", "d"]
    assert fold.state.held_jobs() == {
        "b": "singleton: waiting for a (same name and team) to end",
        "c": "singleton: waiting for a (same name and team) to end",
    }
    fold.start("a")
    fold.apply(JobCompleted(job_id="a", attempt=1, at=3.0))
    assert fold.ready() == ["b", "d"]  # one at a time, in arrival order
    assert reconcile(fold.state.jobs["c"], fold.state, 4.0) == []  # a singleton is never failed


def test_the_hold_survives_a_snapshot() -> None:
    fold = Fold()
    fold.submit("a", spec("prep"))
    fold.submit("b", spec(deps=(Dependency(kind="after-ok", job_id="a"),)))
    restored = ClusterState.decode(fold.state.encode())
    assert [j.job_id for j in restored.ready_jobs(10.0)] == ["a"]
    assert restored.dependents_of("a") == {"b"}


def _body(**extra: object) -> dict[str, object]:
    return {"name": "x", "team": "nlp", "gpus": 1, "command": ["x"], **extra}


@pytest.mark.parametrize(
    ("depends_on", "field", "detail"),
    [
        ("j-1", "depends_on", "must be an array of objects, got string"),
        (["j-1"], "depends_on[0]", "must be an object {kind, job_id}, got string"),
        ([{"kind": "before", "job_id": "j-1"}], "depends_on[0].kind", "must be one of after, after-ok"),
        ([{"kind": "after", "job_id": "a b"}], "depends_on[0].job_id", "must be a job id"),
        ([{"kind": "after", "job_id": "j", "x": 1}], "depends_on[0].x", "unknown field"),
        ([{"kind": "after", "job_id": "j"}] * 2, "depends_on", "lists a dependency more than once"),
        ([{"kind": "after", "job_id": f"j{i}"} for i in range(65)], "depends_on", "at most 64"),
    ],
)
def test_a_bad_dependency_names_its_field(depends_on: object, field: str, detail: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(_body(depends_on=depends_on))
    assert err.value.field == field and detail in err.value.detail


def test_a_good_submission_keeps_its_dependencies() -> None:
    got = validate_spec(_body(depends_on=[{"kind": "after-ok", "job_id": "j-1"}], singleton=True))
    assert got.depends_on == (Dependency(kind="after-ok", job_id="j-1"),) and got.singleton
    with pytest.raises(SpecError, match="must be true or false"):
        validate_spec(_body(singleton="yes"))


def test_a_workload_may_only_wait_for_jobs_that_arrive_first() -> None:
    line = '{{"id": "{id}", "submit": {t}, "gpus": 1, "duration": 5, "team": "t"{extra}}}'
    dep = ', "depends_on": [{"kind": "after-ok", "job_id": "a"}]'
    ok = [line.format(id="a", t=0, extra=""), line.format(id="b", t=0, extra=dep)]
    assert [j.depends_on for j in parse_lines(ok)][1] == (Dependency(kind="after-ok", job_id="a"),)
    with pytest.raises(WorkloadError, match="job b depends on a, which does not arrive before it"):
        parse_lines([line.format(id="b", t=0, extra=dep), line.format(id="a", t=0, extra="")])
    with pytest.raises(WorkloadError, match="job b depends on a, which is not in the workload"):
        parse_lines([line.format(id="b", t=0, extra=dep)])
