"""Policies: small plug-ins (order / filter / permit / place / reserve / preempt / grow) chosen by name.

A :class:`Policy` is data: a name, a :class:`PolicyConfig` and one object per extension point. The
engine calls the extension points; it contains no policy-specific branches. New policies register a
factory with :func:`register_policy`.

Built-in policies:

- ``fifo``: strict submission order, consolidated first fit (a job of at most one node's GPUs goes on one
  node), stops at the first job that does not fit; no backfill, no preemption, no quotas.
- ``easy-backfill``: priority class order (then submission), EASY backfill around one reservation for the
  blocked head job (runtime from learned history, else time limit).
- ``las``: Tiresias-style 2D least-attained-service: queues by attained GPU-seconds (thresholds 3,250 and
  7,200 GPU-s), FIFO inside a queue, preemptive across queues.
- ``rallypoint``: strict priority classes from ``training-high`` (800) up; below them least expected
  remaining work (GPUs x time limit left; attained service without one) first and the class second (a lower
  class never evicts a higher one), DRF fair share between teams, quotas with cohort borrowing,
  EASY backfill, topology-aware best fit, consolidation of fragmented nodes (a few small jobs are
  checkpointed and re-placed so a blocked gang fits), least-disruptive preemption (shrink > reclaim >
  priority),
  elastic gangs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from rallypoint.core import sharing
from rallypoint.core.backfill import EasyReserver, Reserver
from rallypoint.core.config import PolicyConfig
from rallypoint.core.context import Ctx, Status
from rallypoint.core.elastic import ElasticGrower, Grower
from rallypoint.core.ordering import (
    ClassLasOrder,
    DrfPriorityOrder,
    FifoOrder,
    LasOrder,
    Orderer,
    PriorityOrder,
)
from rallypoint.core.preemption import Preemptor, RankPreemptor
from rallypoint.core.quota import RESOURCES, job_milli
from rallypoint.core.types import PendingJob

__all__ = [
    "Filter",
    "NoQuota",
    "Permit",
    "Policy",
    "QuotaPermit",
    "ServiceCapacity",
    "ShapeFilter",
    "policy_by_name",
    "policy_from_config",
    "policy_names",
    "register_policy",
]


class Filter(Protocol):
    def check(self, job: PendingJob, ctx: Ctx) -> Status | None:
        """None if the job may be considered, else an Unschedulable status."""
        ...


class Permit(Protocol):
    def check(
        self, job: PendingJob, gpu_type: str, gpus: int, ctx: Ctx, share: int | None = None
    ) -> str | None:
        """None if ``gpus`` GPUs of ``gpu_type`` may be admitted for ``job`` now, else why not. For
        ``quota.CPU`` / ``MEMORY``, ``gpus`` is the amount itself; ``share`` is the thousandths of its GPU
        a fractional job asking for GPU memory got where it was placed (``quota.job_milli``)."""
        ...


class ShapeFilter:
    """Rejects malformed gangs: sizes that are not a whole number of tasks (``GangTooLarge``), and a GPU
    type request that names both ``gpu_type`` and ``gpu_types`` or an empty ``gpu_types`` (``Invalid``)."""

    def check(self, job: PendingJob, ctx: Ctx) -> Status | None:
        if job.gpus_per_task <= 0 or job.gpus <= 0 or job.gpus % job.gpus_per_task:
            return Status(
                "GangTooLarge", f"{job.gpus} GPUs is not a whole number of {job.gpus_per_task}-GPU tasks"
            )
        alts = job.gpu_types
        if alts is not None:
            if job.gpu_type is not None:
                return Status(
                    "Invalid",
                    f"names both gpu_type {job.gpu_type} and gpu_types {'|'.join(alts)}; set one of them",
                )
            if not alts:
                return Status("Invalid", "gpu_types is empty; leave it unset to allow any GPU type")
        return None


class QuotaPermit:
    def check(
        self, job: PendingJob, gpu_type: str, gpus: int, ctx: Ctx, share: int | None = None
    ) -> str | None:
        q = job.queue  # job.queue_name inlined (runs for every pending job)
        if gpu_type not in RESOURCES:  # GPU quota counts thousandths of a GPU
            if share is None and job.gpu_memory_mib is not None:
                share = sharing.least_share(job, gpu_type, ctx)
            gpus = job_milli(job, gpus, share)
        return ctx.quota.check(ctx.ws, q if q is not None else job.team, gpu_type, gpus)


class ServiceCapacity:
    """A service (``kind: service``) waits while its queue's services already hold the GPUs the queue
    reserves for them (``Queue.service_gpus``). A filter, not a permit: no preemption can make that room
    (services are never victims), so the job is not offered to the preemptor or a reservation."""

    def check(self, job: PendingJob, ctx: Ctx) -> Status | None:
        if not job.service:
            return None
        why = ctx.quota.service_refusal(ctx.ws, job.queue_name, job.gpus)
        return Status("QuotaExceeded", why) if why is not None else None


class NoQuota:
    def check(
        self, job: PendingJob, gpu_type: str, gpus: int, ctx: Ctx, share: int | None = None
    ) -> str | None:
        return None


@dataclass(frozen=True)
class Policy:
    name: str
    config: PolicyConfig
    orderer: Orderer
    filters: tuple[Filter, ...] = (ShapeFilter(),)
    permit: Permit = field(default_factory=NoQuota)
    reserver: Reserver | None = None
    preemptor: Preemptor | None = None
    grower: Grower | None = None
    priority_reason: str = "priority"

    def reason_for(self, kind: str) -> str:
        return self.priority_reason if kind == "priority" else kind

    @property
    def version(self) -> str:
        """Policy version recorded with decisions: name, config version and a digest of the config."""
        import hashlib

        digest = hashlib.sha256(msgspec.json.encode(self.config)).hexdigest()[:12]
        return f"{self.name}/{self.config.version}/{digest}"


def _fifo(cfg: PolicyConfig) -> Policy:
    return Policy("fifo", cfg, FifoOrder())


def _easy(cfg: PolicyConfig) -> Policy:
    return Policy("easy-backfill", cfg, PriorityOrder(), reserver=EasyReserver())


def _las(cfg: PolicyConfig) -> Policy:
    return Policy("las", cfg, LasOrder(), preemptor=RankPreemptor(), priority_reason="las")


def _rallypoint(cfg: PolicyConfig) -> Policy:
    return Policy(
        "rallypoint",
        cfg,
        ClassLasOrder() if cfg.class_las else DrfPriorityOrder(),
        filters=(ShapeFilter(), ServiceCapacity()),
        permit=QuotaPermit(),
        reserver=EasyReserver() if cfg.backfill else None,
        preemptor=(
            RankPreemptor(borrowers_only=cfg.class_las, quota_aware=cfg.preempt_for_quota)
            if cfg.preemption
            else None
        ),
        grower=ElasticGrower() if cfg.elastic else None,
    )


_DEFAULTS: dict[str, dict[str, Any]] = {
    "fifo": {"first_fit": True, "consolidate_small": True, "stop_at_first_block": True},
    "easy-backfill": {"backfill": True, "max_reservations": 1},
    "las": {"preemption": True, "las_thresholds": (3250.0, 7200.0), "preemption_protection_s": 0.0},
    "rallypoint": {
        "backfill": True,
        "max_reservations": 1,
        "preemption": True,
        "consolidation": True,
        "quotas": True,
        "elastic": True,
        "class_las": True,
        "las_thresholds": (3250.0, 7200.0),
        "level_by_estimate": True,
        "level_aging_s": 0.0,
        "strict_class_min": 800,
        "start_protection_s": 600.0,
        "preempt_for_quota": True,
    },
}

_FACTORIES: dict[str, Callable[[PolicyConfig], Policy]] = {
    "fifo": _fifo,
    "easy-backfill": _easy,
    "las": _las,
    "rallypoint": _rallypoint,
}


def register_policy(
    name: str, factory: Callable[[PolicyConfig], Policy], defaults: Mapping[str, Any] = {}
) -> None:
    _FACTORIES[name] = factory
    _DEFAULTS[name] = dict(defaults)


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_FACTORIES))


def policy_by_name(name: str, overrides: Mapping[str, Any] | PolicyConfig | None = None) -> Policy:
    """The named policy with its defaults, optionally overridden (a mapping of PolicyConfig fields, or a
    whole PolicyConfig). Raises KeyError for an unknown name."""
    if name not in _FACTORIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
    if isinstance(overrides, PolicyConfig):
        cfg = overrides
    else:
        merged = {**_DEFAULTS[name], **dict(overrides or {})}
        cfg = msgspec.convert(merged, PolicyConfig)
    return _FACTORIES[name](cfg)


def policy_from_config(spec: Mapping[str, Any]) -> Policy:
    """``{"policy": "rallypoint", <PolicyConfig fields>...}`` (e.g. parsed from a YAML file)."""
    d = dict(spec)
    name = d.pop("policy", "rallypoint")
    return policy_by_name(str(name), d)
