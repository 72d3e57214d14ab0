"""What a waiting job lacks, in numbers (``rally why JOB``): free GPUs of each type it may use, its
queue's quota room, and the sentences saying what would let it start.

Pure, like the rest of the core: the same snapshot gives the same explanation. It reads the snapshot the
way a cycle does (``Ctx``: the workspace's free GPUs, the ``QuotaBook``'s usage, cohort and org caps), so
its numbers are the scheduler's, not a second formula that could drift from them. It decides nothing: no
placement is taken, no job ordered; a job that fits by these numbers may still wait behind others
(its pending reason says so).
"""

from __future__ import annotations

import msgspec

from rallypoint.core import sharing
from rallypoint.core.config import PolicyConfig
from rallypoint.core.context import Ctx
from rallypoint.core.placement import best_free_at, place
from rallypoint.core.types import PendingJob, Snapshot
from rallypoint.core.units import GPU_MILLI, gpus_of, job_milli

__all__ = ["Explanation", "GpuRoom", "OrgRoom", "QuotaRoom", "explain"]


class GpuRoom(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs of one type the job may bind on, where its gang must fit (``level``: the cluster, or the
    topology level it requires): ``free`` in all, ``best_free`` inside the best such domain, ``short``
    how many more free GPUs it needs there, and whether its tasks place now (``fits``)."""

    gpu_type: str
    free: int
    schedulable: int
    level: str
    best_free: int
    short: int
    fits: bool


class OrgRoom(msgspec.Struct, frozen=True, kw_only=True):
    """An org above the job's queue: the GPUs of the type used below it and its cap (GPUs: a share or a
    MIG slice counts for its part of one, ``core.units``)."""

    org: str
    used: float
    cap: float


class QuotaRoom(msgspec.Struct, frozen=True, kw_only=True):
    """The job's queue's quota for one GPU type: what it uses, its nominal and borrowing limit, what its
    cohort can lend it now, the orgs capping it; ``room`` GPUs it admits now, ``short`` of the job's ask,
    and ``ceiling`` the most it could ever hold (None: no cap), with what sets it. In GPUs, where a share or
    a MIG slice counts for its part of one (``core.units``): 2.25 is two GPUs and a quarter."""

    queue: str
    gpu_type: str
    #: the quota the job's ask takes (a quarter-GPU notebook: 0.25)
    asked: float
    used: float
    nominal: float
    borrowing_limit: float | None
    cohort_lendable: float
    orgs: tuple[OrgRoom, ...]
    room: float
    short: float
    ceiling: float | None
    ceiling_set_by: str


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """``asked``: the fewest GPUs that start the job (an elastic gang's minimum), in tasks of
    ``gpus_per_task``; ``gpus`` and ``quotas`` per type it may use, in its order of preference (no quota
    rows: its queue has none); ``would_start``: what would let it start, one sentence each."""

    job_id: str
    asked: int
    gpus_per_task: int
    gpus: tuple[GpuRoom, ...]
    quotas: tuple[QuotaRoom, ...]
    would_start: tuple[str, ...]


def explain(snapshot: Snapshot, job: PendingJob, config: PolicyConfig) -> Explanation:
    """Why ``job`` (pending, not in ``snapshot.cluster``) cannot start now under the policy ``config``
    (its quotas, elastic sizes and topology rules), as numbers and sentences."""
    ctx = Ctx(snapshot, config)
    asked = job.min_gpus if job.min_gpus is not None and ctx.cfg.elastic else job.gpus
    types = ctx.job_types(job)
    rooms = tuple(_gpu_room(ctx, job, t, asked) for t in types)
    quotas = tuple(
        _quota_room(ctx, job.queue_name, t, _asked_milli(job, asked, t, ctx))
        for t in types
        if ctx.quota.limited(job.queue_name)
    )
    return Explanation(
        job_id=job.id,
        asked=asked,
        gpus_per_task=job.gpus_per_task,
        gpus=rooms,
        quotas=quotas,
        would_start=_would_start(job, asked, rooms, quotas),
    )


def _gpu_room(ctx: Ctx, job: PendingJob, gpu_type: str, asked: int) -> GpuRoom:
    required = ctx.required_level(job)
    level = required or "cluster"
    free = ctx.ws.type_free.get(gpu_type, 0)
    best = free if level == "cluster" else best_free_at(ctx.ws, gpu_type, level)
    tasks = asked // job.gpus_per_task
    plan = place(ctx.ws, tasks, job.gpus_per_task, gpu_type, required, ctx.cfg.first_fit)
    return GpuRoom(
        gpu_type=gpu_type,
        free=free,
        schedulable=ctx.healthy_capacity(gpu_type, "cluster"),
        level=level,
        best_free=best,
        short=max(0, asked - best),
        fits=plan is not None,
    )


def _asked_milli(job: PendingJob, asked: int, gpu_type: str, ctx: Ctx) -> int:
    """The GPU quota ``asked`` GPUs of ``job`` take (``units.job_milli``; a job asking for GPU memory:
    its smallest share on ``gpu_type``)."""
    least = sharing.least_share(job, gpu_type, ctx) if job.gpu_memory_mib is not None else None
    return job_milli(job, asked, least)


def _quota_room(ctx: Ctx, queue: str, gpu_type: str, asked: int) -> QuotaRoom:
    """The room ``QuotaBook.check`` grants: nominal left, plus what it may borrow (the cohort's lendable
    GPUs, up to its borrowing limit), within every org cap above it. ``asked`` and the book's amounts
    are thousandths of a GPU; the room's figures are GPUs."""
    book, ws = ctx.quota, ctx.ws
    used = ws.usage.get((queue, gpu_type), 0)
    nominal = book.nominal(queue, gpu_type)
    quota = book.quota(queue, gpu_type)
    limit = quota.borrowing_limit if quota is not None else None
    limit = limit * GPU_MILLI if limit is not None else None
    lendable = book.cohort_available(ws, book.queues[queue], gpu_type)
    borrowable = lendable if limit is None else min(limit, lendable)
    caps = [
        (org, book.org_usage(ws, org, gpu_type), (cap.nominal + (cap.borrowing_limit or 0)) * GPU_MILLI)
        for org in book.ancestors(queue)
        if (cap := book.quota(org, gpu_type)) is not None
    ]
    room = max(0, min([nominal + borrowable - used, *(c - u for _o, u, c in caps)]))
    ceiling = book.ceiling(queue, gpu_type)
    return QuotaRoom(
        queue=queue,
        gpu_type=gpu_type,
        asked=gpus_of(asked),
        used=gpus_of(used),
        nominal=gpus_of(nominal),
        borrowing_limit=gpus_of(limit) if limit is not None else None,
        cohort_lendable=gpus_of(lendable),
        orgs=tuple(OrgRoom(org=o, used=gpus_of(u), cap=gpus_of(c)) for o, u, c in caps),
        room=gpus_of(room),
        short=gpus_of(max(0, asked - room)),
        ceiling=gpus_of(ceiling[0]) if ceiling is not None else None,
        ceiling_set_by=ceiling[1] if ceiling is not None else "",
    )


def _would_start(
    job: PendingJob, asked: int, rooms: tuple[GpuRoom, ...], quotas: tuple[QuotaRoom, ...]
) -> tuple[str, ...]:
    """One sentence per thing that would let the job start on its first type; its other types (several
    allowed) are the alternatives: "or ..." for each."""
    if not rooms:
        return (
            f"a node with GPU type {job.gpu_type or '|'.join(job.gpu_types or ())}: the cluster has none",
        )
    quota_of = {q.gpu_type: q for q in quotas}
    lines: list[str] = []
    for i, room in enumerate(rooms):
        needs = [*_gpu_needs(job, asked, room), *_quota_needs(quota_of.get(room.gpu_type))]
        if not needs:
            return (
                f"nothing it lacks: {asked} {room.gpu_type} GPUs fit now and its quota admits them; it "
                "starts at the scheduler's next cycle unless jobs ahead take them first",
            )
        lead = "" if i == 0 else "or, on its next GPU type: "
        lines.extend(lead + need if j == 0 else need for j, need in enumerate(needs))
    return tuple(lines)


def _gpu_needs(job: PendingJob, asked: int, room: GpuRoom) -> list[str]:
    t, g = room.gpu_type, job.gpus_per_task
    if room.schedulable < asked:
        return [
            f"{asked - room.schedulable} more {t} GPUs on healthy nodes (it needs {asked}; "
            f"{room.schedulable} are on schedulable nodes)"
        ]
    if room.short:
        where = "" if room.level == "cluster" else f" in one {room.level}"
        best = "free" if room.level == "cluster" else f"free in the best {room.level}"
        return [f"{room.short} more free {t} GPUs{where} (it needs {asked}; {room.best_free} {best})"]
    if not room.fits:
        return [
            f"{asked // g} blocks of {g} free {t} GPUs on one node each: {room.free} are free but "
            "fragmented (a topology constraint)"
        ]
    return []


def _quota_needs(quota: QuotaRoom | None) -> list[str]:
    if quota is None or not quota.short:
        return []
    if quota.ceiling is not None and quota.ceiling < quota.asked:
        return [
            f"a larger quota: queue {quota.queue} can never hold more than {quota.ceiling:g} "
            f"{quota.gpu_type} GPUs ({quota.ceiling_set_by}); the queue file must change"
        ]
    limit = "" if quota.borrowing_limit is None else f", borrowing limit {quota.borrowing_limit:g}"
    caps = "".join(f"; org {o.org} uses {o.used:g} of {o.cap:g}" for o in quota.orgs)
    return [
        f"room for {quota.short:g} more {quota.gpu_type} GPUs in queue {quota.queue}'s quota (it uses "
        f"{quota.used:g} of nominal {quota.nominal:g}{limit}; its cohort can lend "
        f"{quota.cohort_lendable:g}{caps})"
    ]
