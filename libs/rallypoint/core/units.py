"""How much of a GPU a job takes, in thousandths (``GPU_MILLI`` per whole GPU): the unit GPU quota and
DRF count in (``core.quota``), so a share or a MIG slice counts for its part of a GPU, not a whole one."""

from __future__ import annotations

from rallypoint.core.types import PendingJob, RunningJob
from rallypoint.events.catalogue import GPU_MILLI, mig_milli

__all__ = ["GPU_MILLI", "gpus_of", "job_milli", "mig_milli", "running_milli"]


def gpus_of(milli: int) -> float:
    """Thousandths of a GPU as GPUs (2250 -> 2.25): what reasons and ``rally why`` show."""
    return milli / GPU_MILLI


def job_milli(job: PendingJob, gpus: int, share: int | None = None) -> int:
    """The GPU quota ``job`` takes at ``gpus`` GPUs: thousandths of a GPU. A fractional job takes its
    share (``share``: the share it got on its GPU, for one that asks for GPU memory; else its
    ``gpu_milli``, a lower bound for such a job), a MIG job its slice (``mig_milli``), a gang every GPU."""
    if job.gpu_milli is not None:
        return share if share is not None else job.gpu_milli
    if job.mig_profile is not None:
        return mig_milli(job.mig_profile)
    return gpus * GPU_MILLI


def running_milli(job: RunningJob) -> int:
    """The GPU quota a running job holds, in thousandths (``job_milli``: its bound share is its
    ``gpu_milli``)."""
    if job.gpu_milli is not None:
        return job.gpu_milli
    if job.mig_profile is not None:
        return mig_milli(job.mig_profile)
    return job.gpus * GPU_MILLI
