"""A fractional job sized by GPU memory (``gpu_memory_mib``): the submission's rules, the fold's check of
its Bind (it must name the share it took, ``TaskPlacement.milli``), what the fold and the bridge then say
it holds, and what its rank is told."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from test_state_fold import LEADERS, bound, fold, node, submit

from rallypoint.events import JobSubmitted, TaskPlacement
from rallypoint.jobs.launch import share_env
from rallypoint.jobs.validate import SpecError, validate_spec
from rallypoint.scheduling.bridge import pending_of, running_of


def _body(**extra: Any) -> dict[str, Any]:
    return {"name": "nb", "team": "nlp", "gpus": 1, "command": ["x"], **extra}


def test_a_memory_share_is_kept_with_or_without_a_fraction() -> None:
    assert validate_spec(_body(gpu_memory_mib=20480)).gpu_memory_mib == 20480
    both = validate_spec(_body(gpu_memory_mib=20480, gpu_milli=300))
    assert (both.gpu_milli, both.gpu_memory_mib) == (300, 20480)


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        ({"gpu_memory_mib": 0}, "must be 1-"),
        ({"gpu_memory_mib": 1024, "gpus": 2}, "runs as gpus=1"),
        ({"gpu_memory_mib": 1024, "gpus": 2, "gpus_per_task": 2, "ranks_per_task": 2}, "runs as gpus=1"),
        ({"gpu_memory_mib": 1024, "min_gpus": 1, "max_gpus": 1}, "cannot be elastic"),
        ({"gpu_memory_mib": 1024, "mig_profile": "1g.10gb"}, "give mig_profile alone"),
    ],
)
def test_a_bad_memory_share_names_gpu_memory_mib(extra: dict[str, Any], detail: str) -> None:
    with pytest.raises(SpecError) as err:
        validate_spec(_body(**extra))
    assert err.value.field == "gpu_memory_mib" and detail in err.value.detail, err.value


def _memory_job() -> JobSubmitted:
    plain = submit("nb", 1, per_task=1)
    spec = msgspec.structs.replace(plain.spec, gpu_memory_mib=20_000, ranks_per_task=1)
    return JobSubmitted(job_id="nb", spec=spec, submitted_at=plain.submitted_at)


def test_the_fold_holds_the_share_its_bind_names_and_refuses_one_that_names_none() -> None:
    named = bound("nb", ("n1", (0,)))
    named = msgspec.structs.replace(
        named, placements=(TaskPlacement(task=0, node_id="n1", gpus=(0,), milli=250),)
    )
    state = fold(*LEADERS, node("n1"), _memory_job(), named)
    assert state.nodes["n1"].shares == {0: {"nb": 250}}
    job = state.jobs["nb"]
    assert running_of(job).gpu_milli == 250
    assert pending_of(job).gpu_milli == 0 and pending_of(job).gpu_memory_mib == 20_000

    unnamed = fold(*LEADERS, node("n1"), _memory_job(), bound("nb", ("n1", (0,))))
    assert unnamed.jobs["nb"].state == "pending" and unnamed.nodes["n1"].shares == {}


def test_the_rank_is_told_the_memory_it_asked_for() -> None:
    env = share_env(250, 80_000, 20_000)
    assert env["RALLY_GPU_MILLI"] == "250" and env["RALLY_GPU_MEMORY_MIB"] == "20000"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
