"""Proof that a sharing case exercised sharing: the binds onto a GPU other parts already held."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rallypoint.core import ClusterModel, RunningJob


@dataclass
class GpuJoins:
    """The jobs bound onto a GPU that other parts already held, by every ``ClusterModel`` of the test
    (simulator and live side alike): ``shares`` joined a shared GPU, ``slices`` a MIG GPU with a busy slice.
    What a sharing case asserts to show it exercised sharing at all."""

    shares: list[str] = field(default_factory=list)
    slices: list[str] = field(default_factory=list)


def count_gpu_joins(monkeypatch: pytest.MonkeyPatch) -> GpuJoins:
    joins = GpuJoins()
    bind_share, bind_mig = ClusterModel._bind_share, ClusterModel._bind_mig

    def share(model: ClusterModel, job: RunningJob) -> None:
        if (job.placements[0].node_id, job.placements[0].gpus[0]) in model.shares:
            joins.shares.append(job.id)
        bind_share(model, job)

    def mig(model: ClusterModel, job: RunningJob) -> None:
        if model.mig_busy.get((job.placements[0].node_id, job.placements[0].gpus[0])):
            joins.slices.append(job.id)
        bind_mig(model, job)

    monkeypatch.setattr(ClusterModel, "_bind_share", share)
    monkeypatch.setattr(ClusterModel, "_bind_mig", mig)
    return joins
