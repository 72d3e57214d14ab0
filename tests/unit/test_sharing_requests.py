"""What a job asks for beyond whole GPUs: `rally submit`'s --gpu-fraction / --cpus / --memory and the spec
rules behind them (``jobs.validate``), each refusal naming the field."""

from __future__ import annotations

import argparse

import pytest

from rallypoint.cli.resources import parse_cpus, parse_gpu_fraction, parse_memory
from rallypoint.jobs import SpecError, validate_spec

BODY = {"name": "nb", "team": "a", "command": ["python", "nb.py"]}


@pytest.mark.parametrize(
    ("text", "milli"), [("4", 4000), ("0.5", 500), ("500m", 500), (".25", 250), ("96", 96000)]
)
def test_cpus(text: str, milli: int) -> None:
    assert parse_cpus(text) == milli


@pytest.mark.parametrize(
    ("text", "mib"),
    [("32G", 32768), ("32GiB", 32768), ("512M", 512), ("1.5T", 1572864), ("100", 100), ("1k", 1)],
)
def test_memory(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


@pytest.mark.parametrize(("text", "milli"), [("0.25", 250), ("25%", 250), ("0.001", 1), ("0.999", 999)])
def test_gpu_fraction(text: str, milli: int) -> None:
    assert parse_gpu_fraction(text) == milli


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_cpus, "four"),
        (parse_cpus, "0.0005"),
        (parse_memory, "12X"),
        (parse_memory, "GiB"),
        (parse_gpu_fraction, "1"),
        (parse_gpu_fraction, "0"),
        (parse_gpu_fraction, "half"),
        (parse_gpu_fraction, "0.0001"),
    ],
)
def test_bad_values_are_refused(parse: object, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)  # type: ignore[operator]


def test_a_valid_fractional_spec_carries_its_share_and_resources() -> None:
    spec = validate_spec({**BODY, "gpus": 1, "gpu_milli": 250, "cpu_milli": 2000, "memory_mib": 4096})
    assert (spec.gpu_milli, spec.cpu_milli, spec.memory_mib, spec.gpus_per_task, spec.ranks_per_task) == (
        250,
        2000,
        4096,
        1,
        1,
    )
    plain = validate_spec({**BODY, "gpus": 8})
    assert (plain.gpu_milli, plain.cpu_milli, plain.memory_mib) == (None, 0, 0)


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"gpus": 2, "gpu_milli": 250}, "gpu_milli", "runs as gpus=1"),
        ({"gpus": 1, "gpu_milli": 1000}, "gpu_milli", "must be 1-999"),
        ({"gpus": 1, "gpu_milli": 0}, "gpu_milli", "must be 1-999"),
        (
            {"gpus": 1, "gpu_milli": 250, "ranks_per_task": 2, "gpus_per_task": 1},
            "ranks_per_task",
            "does not divide",
        ),
        ({"gpus": 1, "gpu_milli": 250, "min_gpus": 1, "max_gpus": 2}, "gpu_milli", "cannot be elastic"),
        ({"gpus": 1, "cpu_milli": -1}, "cpu_milli", "must be >= 0"),
        ({"gpus": 1, "memory_mib": 1 << 40}, "memory_mib", "must be <="),
        ({"gpus": 1, "gpu_milli": 0.5}, "gpu_milli", "must be an integer"),
    ],
)
def test_impossible_mixes_name_the_field(extra: dict[str, object], field: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec({**BODY, **extra})
    assert err.value.field == field and says in str(err.value), err.value


def test_a_mig_spec_names_a_known_profile_and_takes_one_gpu_and_rank() -> None:
    assert validate_spec({**BODY, "gpus": 1, "mig_profile": "3g.40gb"}).mig_profile == "3g.40gb"
    for extra, says in (
        ({"gpus": 1, "mig_profile": "9g.99gb"}, "is not a MIG profile; one of 1g.10gb"),
        ({"gpus": 2, "mig_profile": "1g.10gb"}, "runs as gpus=1"),
        ({"gpus": 1, "mig_profile": "1g.10gb", "gpu_milli": 100}, "not both"),
        ({"gpus": 1, "mig_profile": "1g.10gb", "min_gpus": 1, "max_gpus": 2}, "cannot be elastic"),
    ):
        with pytest.raises(SpecError) as err:
            validate_spec({**BODY, **extra})
        assert err.value.field == "mig_profile" and says in str(err.value), err.value


def test_a_queue_file_gives_teams_cpu_and_memory_quota() -> None:
    from rallypoint.core.types import CPU, MEMORY
    from rallypoint.scheduling.config import core_queues
    from rallypoint.scheduling.queues import QueuesError, queues_from_obj

    teams = [{"name": "nlp", "nominal": 8, "cpus": 1.5, "memory_gib": 2}, {"name": "cv", "nominal": 8}]
    queues, _ = core_queues(queues_from_obj({"teams": teams}))
    by_name = {q.name: {qt.gpu_type: qt.nominal for qt in q.quotas} for q in queues}
    assert by_name == {"nlp": {"*": 8, CPU: 1500, MEMORY: 2048}, "cv": {"*": 8}}
    with pytest.raises(QueuesError, match="cpus must be a number >= 0"):
        queues_from_obj({"teams": [{"name": "nlp", "cpus": -1}]})
