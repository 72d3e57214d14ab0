"""Job-spec validation: tables of bodies and the field each must be rejected on, plus the defaults."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.events import JobSpec
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs import (
    PRIORITY_CLASSES,
    SpecError,
    check_fits_cluster,
    job_id_for,
    new_job_id,
    validate_spec,
)

_DROP = object()  # an override that removes the field


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "llama-pretrain",
        "team": "nlp",
        "gpus": 16,
        "command": ["python", "train.py"],
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


# --- accepted bodies and their defaults -----------------------------------------------------------

DEFAULTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "minimal 16 gpus",
        body(),
        {
            "gpus_per_task": 8,
            "ranks_per_task": 8,
            "priority": "training-standard",
            "env": {},
            "max_retries": 0,
            "time_limit_s": None,
            "min_gpus": None,
        },
    ),
    ("small job: one task of all its gpus", body(gpus=2), {"gpus_per_task": 2, "ranks_per_task": 2}),
    ("explicit per task", body(gpus=16, gpus_per_task=4), {"gpus_per_task": 4, "ranks_per_task": 4}),
    ("one rank per task", body(gpus=8, ranks_per_task=1), {"gpus_per_task": 8, "ranks_per_task": 1}),
    ("two ranks per task", body(gpus=8, gpus_per_task=8, ranks_per_task=2), {"ranks_per_task": 2}),
    ("tuple command", body(command=("python", "-c", "pass")), {"command": ("python", "-c", "pass")}),
    ("dotted name", body(name="run.v2_final-3"), {"name": "run.v2_final-3"}),
    ("one char name", body(name="a"), {"name": "a"}),
    ("63 char name", body(name="a" * 63), {"name": "a" * 63}),
    ("env", body(env={"NCCL_DEBUG": "INFO", "_X1": ""}), {"env": {"NCCL_DEBUG": "INFO", "_X1": ""}}),
    ("priority", body(priority="production"), {"priority": "production"}),
    ("time limit", body(time_limit_s=3600), {"time_limit_s": 3600}),
    ("retries max", body(max_retries=100), {"max_retries": 100}),
    ("gpu types", body(gpu_types=["H100", "A100"]), {"gpu_types": ("H100", "A100"), "gpu_type": None}),
    (
        "topology",
        body(topology_required="rack", topology_preferred="node"),
        {"topology_required": "rack", "topology_preferred": "node"},
    ),
    (
        "same topology level",
        body(topology_required="rack", topology_preferred="rack"),
        {"topology_preferred": "rack"},
    ),
    ("elastic defaults", body(gpus=16, min_gpus=8), {"min_gpus": 8, "max_gpus": 16, "gpu_step": 8}),
    (
        "elastic full",
        body(gpus=16, gpus_per_task=4, min_gpus=8, max_gpus=32, gpu_step=4),
        {"min_gpus": 8, "max_gpus": 32, "gpu_step": 4},
    ),
    ("nulls mean default", body(priority=None, env=None, gpu_type=None), {"priority": "training-standard"}),
    ("gpu type", body(gpu_type="H100-80GB"), {"gpu_type": "H100-80GB"}),
    # JSON Schema's integer, which the OpenAPI document promises, includes 16.0 (schemathesis sends it)
    ("integral numbers", body(gpus=16.0, time_limit_s=60.0), {"gpus": 16, "time_limit_s": 60}),
]


@pytest.mark.parametrize(("case", "given", "expected"), DEFAULTS, ids=[c[0] for c in DEFAULTS])
def test_accepted(case: str, given: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = validate_spec(given)
    assert isinstance(spec, JobSpec)
    for field, value in expected.items():
        assert getattr(spec, field) == value, field


def test_max_gpus_per_node_sets_the_default_task_size() -> None:
    spec = validate_spec(body(gpus=16), max_gpus_per_node=4)
    assert (spec.gpus_per_task, spec.ranks_per_task) == (4, 4)


@pytest.mark.parametrize("priority", PRIORITY_CLASSES)
def test_every_priority_class_is_accepted(priority: str) -> None:
    kind = {"kind": "interactive"} if priority == "interactive" else {}  # that class is its kind's alone
    assert validate_spec(body(priority=priority, **kind)).priority == priority


def test_an_interactive_job_gets_its_own_class_and_no_other_kind_may() -> None:
    spec = validate_spec(body(kind="interactive", ports=[8888, 6006]))
    assert (spec.kind, spec.priority, spec.ports) == ("interactive", "interactive", (6006, 8888))
    # a cluster whose queue file has no such class: the cluster's default
    assert (
        validate_spec(body(kind="interactive"), priority_classes=("low",), default_priority="low").priority
        == "low"
    )
    for refused, field in (
        (body(priority="interactive"), "priority"),
        (body(kind="interactive", max_retries=2), "max_retries"),
        (body(kind="interactive", gpus=2, min_gpus=1, gpus_per_task=1), "kind"),
        (body(kind="shell"), "kind"),
        (body(ports=[80]), "ports"),
        (body(ports=[8888, 8888]), "ports"),
        (body(ports=[True]), "ports"),
        (body(ports="8888"), "ports"),
    ):
        with pytest.raises(SpecError) as err:
            validate_spec(refused)
        assert err.value.field == field


# --- a cluster's own priority classes (its queue file's) -------------------------------------------

CLUSTER_CLASSES = ("urgent", "batch", "scavenger")


def test_a_clusters_own_class_is_accepted() -> None:
    spec = validate_spec(
        body(priority="scavenger"), priority_classes=CLUSTER_CLASSES, default_priority="batch"
    )
    assert spec.priority == "scavenger"


@pytest.mark.parametrize("given", [body(), body(priority=None)])
def test_no_priority_gets_the_clusters_default(given: dict[str, Any]) -> None:
    assert (
        validate_spec(given, priority_classes=CLUSTER_CLASSES, default_priority="batch").priority == "batch"
    )
    # the default is the caller's to give with the built-in classes too (a queue file may name one)
    assert validate_spec(given, default_priority="development").priority == "development"


def test_a_builtin_class_the_cluster_lacks_is_refused_naming_the_clusters() -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(body(priority="production"), priority_classes=CLUSTER_CLASSES, default_priority="batch")
    assert caught.value.field == "priority"
    assert caught.value.detail == "'production' is not a priority class here; one of urgent, batch, scavenger"


def test_a_cluster_without_classes_refuses_every_named_class() -> None:
    assert validate_spec(body(), priority_classes=(), default_priority="batch").priority == "batch"
    with pytest.raises(SpecError) as caught:
        validate_spec(body(priority="batch"), priority_classes=(), default_priority="batch")
    assert caught.value.field == "priority" and "defines no priority class" in caught.value.detail


# --- rejected bodies: the field each error names ----------------------------------------------------

REJECTED: list[tuple[str, object, str, str]] = [
    # (case, body, field, a fragment of the detail)
    ("not an object", ["x"], "body", "JSON object"),
    ("zero gpus", body(gpus=0), "gpus", ">= 1"),
    ("negative gpus", body(gpus=-8), "gpus", ">= 1"),
    ("missing gpus", body(gpus=_DROP), "gpus", "required"),
    ("missing name", body(name=_DROP), "name", "required"),
    ("missing team", body(team=_DROP), "team", "required"),
    ("missing command", body(command=_DROP), "command", "required"),
    ("unknown field", body(gpu=4), "gpu", "unknown field"),
    ("unknown fields sorted", body(zeta=1, alpha=2), "alpha", "alpha, zeta"),
    ("gpus as string", body(gpus="8"), "gpus", "integer, got string"),
    ("gpus as a fraction", body(gpus=8.5), "gpus", "integer, got number"),
    ("gpus as bool", body(gpus=True), "gpus", "integer, got boolean"),
    ("name as int", body(name=7), "name", "string, got integer"),
    ("uppercase name", body(name="Llama"), "name", "not a valid job name"),
    ("name with space", body(name="my job"), "name", "not a valid job name"),
    ("name starts with dash", body(name="-x"), "name", "not a valid job name"),
    ("name ends with dot", body(name="x."), "name", "not a valid job name"),
    ("name too long", body(name="a" * 64), "name", "not a valid job name"),
    ("empty name", body(name=""), "name", "not a valid job name"),
    ("team with dot", body(team="nlp.core"), "team", "not a valid team"),
    ("team uppercase", body(team="NLP"), "team", "not a valid team"),
    ("team wildcard", body(team="*"), "team", "not a valid team"),
    ("per task does not divide", body(gpus=12, gpus_per_task=8), "gpus_per_task", "does not divide gpus=12"),
    ("default per task does not divide", body(gpus=12), "gpus_per_task", "defaults to 8"),
    ("per task above node", body(gpus=16, gpus_per_task=16), "gpus_per_task", "<= 8"),
    ("per task zero", body(gpus_per_task=0), "gpus_per_task", ">= 1"),
    ("ranks do not divide", body(gpus=8, ranks_per_task=3), "ranks_per_task", "does not divide"),
    ("ranks zero", body(ranks_per_task=0), "ranks_per_task", ">= 1"),
    ("empty command", body(command=[]), "command", "must not be empty"),
    ("command string", body(command="python train.py"), "command", "array of strings"),
    ("command with int", body(command=["python", 3]), "command", "element 1"),
    ("command empty program", body(command=["", "x"]), "command", "element 0"),
    ("bad priority", body(priority="urgent"), "priority", "not a priority class"),
    ("zero time limit", body(time_limit_s=0), "time_limit_s", "> 0"),
    ("time limit string", body(time_limit_s="1h"), "time_limit_s", "integer"),
    ("bad topology", body(topology_required="datacenter"), "topology_required", "not a topology level"),
    (
        "preferred wider than required",
        body(topology_required="node", topology_preferred="rack"),
        "topology_preferred",
        "wider",
    ),
    ("env not object", body(env=["A=1"]), "env", "object"),
    ("env value int", body(env={"A": 1}), "env", "must be a string"),
    ("env bad name", body(env={"1A": "x"}), "env", "not a valid environment variable"),
    ("retries negative", body(max_retries=-1), "max_retries", "between 0 and 100"),
    ("gpu types and gpu type", body(gpu_type="A100", gpu_types=["H100"]), "gpu_types", "not both"),
    ("gpu types not array", body(gpu_types="H100,A100"), "gpu_types", "array of strings"),
    ("gpu types empty", body(gpu_types=[]), "gpu_types", "must not be empty"),
    ("gpu types empty item", body(gpu_types=["H100", ""]), "gpu_types", "item 1"),
    ("gpu types repeated", body(gpu_types=["H100", "H100"]), "gpu_types", "more than once"),
    ("gpu types too many", body(gpu_types=[f"t{i}" for i in range(17)]), "gpu_types", "at most 16"),
    ("retries too many", body(max_retries=101), "max_retries", "between 0 and 100"),
    ("elastic min above gpus", body(gpus=16, min_gpus=24), "min_gpus", "more than gpus"),
    ("elastic max below gpus", body(gpus=16, max_gpus=8), "max_gpus", "less than gpus"),
    ("elastic min zero", body(gpus=16, min_gpus=0), "min_gpus", ">= 1"),
    (
        "elastic step not task multiple",
        body(gpus=16, gpus_per_task=8, min_gpus=8, gpu_step=4),
        "gpu_step",
        "multiple",
    ),
    (
        "elastic min not task multiple",
        body(gpus=16, gpus_per_task=8, min_gpus=4, gpu_step=8),
        "min_gpus",
        "multiple",
    ),
    (
        "elastic max unreachable",
        body(gpus=16, gpus_per_task=4, min_gpus=8, max_gpus=30, gpu_step=4),
        "max_gpus",
        "not reachable",
    ),
    (
        "elastic gpus unreachable",
        body(gpus=16, gpus_per_task=4, min_gpus=4, gpu_step=8),
        "gpu_step",
        "not reachable",
    ),
    ("step without bounds", body(gpu_step=8), "gpu_step", "elastic"),
    ("empty gpu type", body(gpu_type=""), "gpu_type", "must not be empty"),
]


@pytest.mark.parametrize(("case", "given", "field", "fragment"), REJECTED, ids=[c[0] for c in REJECTED])
def test_rejected(case: str, given: object, field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(given)
    assert caught.value.field == field
    assert fragment in caught.value.detail


def test_error_message_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"^gpus: must be >= 1, got 0$"):
        validate_spec(body(gpus=0))


# --- fitting the cluster --------------------------------------------------------------------------


def test_too_large_for_the_cluster() -> None:
    spec = validate_spec(body(gpus=999, gpus_per_task=1))
    with pytest.raises(SpecError) as caught:
        check_fits_cluster(spec, total_gpus=32, max_gpus_per_node=8)
    assert (caught.value.field, caught.value.detail) == ("gpus", "asks for 999 GPUs; the cluster has 32")


def test_fits_the_cluster_exactly() -> None:
    check_fits_cluster(validate_spec(body(gpus=32)), total_gpus=32, max_gpus_per_node=8)


def test_task_larger_than_every_node() -> None:
    spec = validate_spec(body(gpus=16, gpus_per_task=8))
    with pytest.raises(SpecError) as caught:
        check_fits_cluster(spec, total_gpus=64, max_gpus_per_node=4)
    assert caught.value.field == "gpus_per_task"


def test_elastic_job_fits_when_its_minimum_does() -> None:
    spec = validate_spec(body(gpus=64, min_gpus=16))
    check_fits_cluster(spec, total_gpus=32, max_gpus_per_node=8)
    with pytest.raises(SpecError) as caught:
        check_fits_cluster(spec, total_gpus=8, max_gpus_per_node=8)
    assert caught.value.field == "min_gpus"


# --- job ids ---------------------------------------------------------------------------------------


def test_job_id_is_deterministic_and_team_scoped() -> None:
    a = job_id_for("nlp", "ci-build-42")
    assert a == job_id_for("nlp", "ci-build-42")
    assert a != job_id_for("vision", "ci-build-42")
    assert a != job_id_for("nlp", "ci-build-43")
    assert a.startswith("j-") and len(a) == 14


@pytest.mark.parametrize("key", ["", "x" * 256, "bad\nkey"])
def test_bad_idempotency_keys(key: str) -> None:
    with pytest.raises(SpecError) as caught:
        job_id_for("nlp", key)
    assert caught.value.field == "idempotency_key"


def test_ids_are_subject_tokens() -> None:
    ids = [new_job_id() for _ in range(100)] + [job_id_for("nlp", f"k{i}") for i in range(100)]
    assert all(TOKEN_PATTERN.match(i) for i in ids)
    assert len(set(ids)) == len(ids)
