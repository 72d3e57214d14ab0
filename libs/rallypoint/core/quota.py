"""Queue quotas with cohort borrowing (Kueue ClusterQueue / cohort semantics), per GPU type.

A team queue may always use its nominal quota. Above nominal it borrows idle nominal of the other queues
in its cohort, up to its own ``borrowing_limit``, and a lender never lends more than its
``lending_limit``. A parent (org) queue with quotas caps the sum of everything below it (its teams, and the
teams of its sub-orgs: org > org > team) at nominal + borrowing limit; each ancestor's cap is checked. A
parent is never a cohort member: its nominal is a cap, not quota to lend. No queues configured, or a queue
the configuration does not name, means no limit.

GPU quota is counted in thousandths of a GPU (``GPU_MILLI`` per whole GPU): a 0.25-GPU notebook uses 250 of
its queue's quota and a ``1g.10gb`` MIG slice 142 (its share of the GPU's seven compute slices), so four
quarter-GPU notebooks use one GPU of quota, not four. The queue file still names whole GPUs; ``QuotaBook``
scales them (``unit``), and every amount it reads or writes in ``Workspace.usage`` for a GPU type is in
thousandths: ``job_milli`` / ``running_milli`` say how many a job takes. CPU and memory keep their own
units (millicores, MiB).
"""

from __future__ import annotations

from functools import partial

from rallypoint.core.types import CPU, MEMORY, SERVICE, Queue, Quota
from rallypoint.core.units import GPU_MILLI, gpus_of, job_milli, mig_milli, running_milli
from rallypoint.core.workspace import Workspace

__all__ = [
    "CPU",
    "MEMORY",
    "RESOURCES",
    "QuotaBook",
    "amount_text",
    "gpus_of",
    "job_milli",
    "mig_milli",
    "resource_units",
    "running_milli",
    "unit",
]

_UNITS = {CPU: "millicores of CPU", MEMORY: "MiB of memory"}
#: the quota keys that are not GPU types (their amounts are not thousandths of a GPU)
RESOURCES = frozenset(_UNITS)


def resource_units(gpu_type: str) -> str:
    """How a quota's amounts read: ``H100 GPUs``, ``millicores of CPU``, ``MiB of memory``."""
    return _UNITS.get(gpu_type) or f"{gpu_type} GPUs"


def unit(gpu_type: str) -> int:
    """What one of the queue file's amounts is in ``Workspace.usage``: a GPU is ``GPU_MILLI``
    thousandths; a millicore or a MiB is itself."""
    return 1 if gpu_type in _UNITS else GPU_MILLI


def amount_text(gpu_type: str, amount: int) -> str:
    """``amount`` of ``gpu_type``'s quota units as read in a reason: GPUs (``2.25``), else the number."""
    return str(amount) if gpu_type in _UNITS else f"{amount / GPU_MILLI:g}"


#: (ancestor name, cap) for each ancestor of a queue with a quota for one GPU type, nearest first.
Ancestors = tuple[tuple[str, int], ...]


class QuotaBook:
    def __init__(self, queues: tuple[Queue, ...]) -> None:
        self.queues = {q.name: q for q in queues}
        self._quota: dict[tuple[str, str], Quota | None] = {}  # quota() is asked per job and cohort member
        # (queue or parent, type) -> (workspace usage version, value): check() runs for every pending job;
        # between two usage changes the cohort's lendable GPUs and an org's total do not change
        self._avail: dict[tuple[str, str], tuple[int, int]] = {}
        self._org_total: dict[tuple[str, str], tuple[int, int]] = {}
        # (cohort, type) -> (usage version, sum of idle lendable nominal, sum borrowed, per member parts)
        self._cohort_sums: dict[tuple[str, str], tuple[int, int, int, dict[str, tuple[int, int]]]] = {}
        self._statics: dict[tuple[str, str], tuple[Queue, int, int | None, Ancestors] | None] = {}
        self._members: dict[tuple[str, str], list[tuple[str, tuple[str, str], int, int | None]]] = {}
        self._ceilings: dict[tuple[str, str], tuple[int, str] | None] = {}
        # parent -> every queue below it, at any depth (an org's total is the sum of their usage)
        self.children: dict[str, list[str]] = {}
        self.cohorts: dict[str, list[str]] = {}
        # CPU / memory are limited only where some queue has a quota for them (else every request passes)
        self.limits_resources = {qt.gpu_type for q in queues for qt in q.quotas if qt.gpu_type in _UNITS}
        ordered = sorted(queues, key=lambda q: q.name)
        parents = {q.parent for q in ordered if q.parent is not None}
        for q in ordered:
            for ancestor in self.ancestors(q.name):
                self.children.setdefault(ancestor, []).append(q.name)
            c = self.cohort_of(q)
            if c is not None and q.name not in parents:
                self.cohorts.setdefault(c, []).append(q.name)

    def ancestors(self, queue: str) -> list[str]:
        """``queue``'s parent, its parent's parent, ... (a cycle, which a checked configuration never has,
        ends the walk instead of looping)."""
        out: list[str] = []
        q = self.queues.get(queue)
        while q is not None and q.parent is not None and q.parent not in out and q.parent != queue:
            out.append(q.parent)
            q = self.queues.get(q.parent)
        return out

    @staticmethod
    def cohort_of(q: Queue) -> str | None:
        return q.cohort if q.cohort is not None else q.parent

    def quota(self, queue: str, gpu_type: str) -> Quota | None:
        key = (queue, gpu_type)
        if key in self._quota:
            return self._quota[key]
        q = self.queues.get(queue)
        found = star = None
        if q is not None:
            for qt in q.quotas:
                if qt.gpu_type == gpu_type:
                    found = qt
                    break
                if qt.gpu_type == "*" and gpu_type not in _UNITS:
                    star = qt
        found = found if found is not None else star
        self._quota[key] = found
        return found

    def limited(self, queue: str) -> bool:
        return queue in self.queues

    def nominal(self, queue: str, gpu_type: str) -> int:
        """``queue``'s nominal quota of ``gpu_type`` in usage units (``unit``: thousandths of a GPU)."""
        qt = self.quota(queue, gpu_type)
        return qt.nominal * unit(gpu_type) if qt is not None else 0

    def borrowing(self, ws: Workspace, queue: str, gpu_type: str) -> int:
        """What ``queue`` uses above its nominal, in usage units (0 for unlimited queues)."""
        if queue not in self.queues:
            return 0
        return max(0, ws.usage.get((queue, gpu_type), 0) - self.nominal(queue, gpu_type))

    def within_nominal(self, ws: Workspace, queue: str, gpu_type: str, gpus: int) -> bool:
        if queue not in self.queues:
            return False
        return ws.usage.get((queue, gpu_type), 0) + gpus <= self.nominal(queue, gpu_type)

    def _static(self, queue: str, gpu_type: str) -> tuple[Queue, int, int | None, Ancestors] | None:
        """What ``check`` needs that does not depend on usage: the queue, its nominal and borrowing limit,
        and the caps of its ancestors that have a quota for the type (memoized: check() runs for every
        pending job). Amounts in usage units (``unit``)."""
        key = (queue, gpu_type)
        st = self._statics.get(key)
        if st is None and key not in self._statics:
            q = self.queues.get(queue)
            if q is not None:
                qt = self.quota(queue, gpu_type)
                u = unit(gpu_type)
                caps = []
                for ancestor in self.ancestors(queue):
                    pq = self.quota(ancestor, gpu_type)
                    if pq is not None:
                        caps.append((ancestor, (pq.nominal + (pq.borrowing_limit or 0)) * u))
                limit = qt.borrowing_limit if qt is not None else None
                st = (
                    q,
                    qt.nominal * u if qt is not None else 0,
                    limit * u if limit is not None else None,
                    tuple(caps),
                )
            self._statics[key] = st
        return st

    def check(self, ws: Workspace, queue: str, gpu_type: str, gpus: int) -> str | None:
        """None if ``queue`` may take ``gpus`` more of ``gpu_type`` now, else why not (with numbers).
        ``gpus`` is in usage units: thousandths of a GPU (``job_milli``), or millicores or MiB for ``CPU``
        or ``MEMORY``, which are unlimited unless some queue has a quota for them."""
        key = (queue, gpu_type)
        st = self._statics.get(key)
        if st is None:
            if gpu_type in _UNITS and gpu_type not in self.limits_resources:
                return None
            st = self._static(queue, gpu_type)
            if st is None:
                return None
        q, nominal, limit, caps = st
        used = ws.usage.get(key, 0)
        new = used + gpus
        if new > nominal:
            borrow = new - nominal
            if limit is not None and borrow > limit:
                return _refusal(
                    gpu_type, "queue {} uses {} {}, nominal {} + borrowing limit {}; needs {} more",
                    queue, used, None, nominal, limit, gpus,
                )  # fmt: skip
            avail = self.cohort_available(ws, q, gpu_type)
            if borrow > avail:
                return _refusal(
                    gpu_type, "queue {} uses {} of {} nominal {}; needs {}; cohort can lend {}",
                    queue, used, nominal, None, gpus, avail,
                )  # fmt: skip
        for parent, cap in caps:
            total = self.org_usage(ws, parent, gpu_type)
            if total + gpus > cap:
                form = "org {} uses {} of {} {}; needs {} more"
                return _refusal(gpu_type, form, parent, total, cap, None, gpus)
        return None

    def service_refusal(self, ws: Workspace, queue: str, gpus: int) -> str | None:
        """None if a service of ``gpus`` GPUs fits what ``queue`` reserves for its services now (a queue
        that reserves nothing does not cap them), else why not, with the numbers. Its own cap, never
        borrowed nor lent: room set aside for serving is not a pool the cohort shares."""
        q = self.queues.get(queue)
        reserved = q.service_gpus if q is not None else None
        if reserved is None:
            return None
        used = ws.usage.get((queue, SERVICE), 0)
        if used + gpus <= reserved:
            return None
        never = f"; never fits: the queue reserves {reserved} for services" if gpus > reserved else ""
        return (
            f"service capacity: queue {queue}'s services hold {used} of its {reserved} reserved GPUs; "
            f"needs {gpus} more{never}"
        )

    def ceiling(self, queue: str, gpu_type: str) -> tuple[int, str] | None:
        """The most of ``gpu_type`` ``queue`` could ever hold (in usage units), whatever the other queues
        do, and what sets it (None: unlimited): its nominal plus all the idle quota its cohort could lend
        (up to its borrowing limit), capped by each ancestor's limit. A job larger than that can never be
        admitted."""
        key = (queue, gpu_type)
        if key in self._ceilings:
            return self._ceilings[key]
        st = self._static(queue, gpu_type)
        found: tuple[int, str] | None = None
        if st is not None:
            q, nominal, limit, caps = st
            lendable = 0
            c = self.cohort_of(q)
            for name in self.cohorts.get(c, ()) if c is not None else ():
                qt = self.quota(name, gpu_type)
                if name != queue and qt is not None:
                    lendable += qt.nominal if qt.lending_limit is None else min(qt.nominal, qt.lending_limit)
            lendable *= unit(gpu_type)
            text = partial(amount_text, gpu_type)
            if limit is not None and limit <= lendable:
                found = (nominal + limit, f"nominal {text(nominal)} + borrowing limit {text(limit)}")
            else:
                lent = f"nominal {text(nominal)} + {text(lendable)} its cohort could lend"
                found = (nominal + lendable, lent)
            for parent, cap in caps:
                if cap < found[0]:
                    found = (cap, f"org {parent}'s limit")
        self._ceilings[key] = found
        return found

    def org_usage(self, ws: Workspace, parent: str, gpu_type: str) -> int:
        """GPUs of ``gpu_type`` used by every queue below ``parent`` (memoized per usage version)."""
        tkey = (parent, gpu_type)
        tm = self._org_total.get(tkey)
        if tm is not None and tm[0] == ws.usage_version:
            return tm[1]
        total = sum(ws.usage.get((c, gpu_type), 0) for c in self.children.get(parent, []))
        self._org_total[tkey] = (ws.usage_version, total)
        return total

    def cohort_available(self, ws: Workspace, q: Queue, gpu_type: str) -> int:
        """Idle lendable nominal of the other cohort members, minus what they already borrow."""
        c = self.cohort_of(q)
        if c is None:
            return 0
        key = (q.name, gpu_type)
        m = self._avail.get(key)
        if m is not None and m[0] == ws.usage_version:
            return m[1]
        v = self._cohort_available(ws, q, c, gpu_type)
        self._avail[key] = (ws.usage_version, v)
        return v

    def _cohort_available(self, ws: Workspace, q: Queue, c: str, gpu_type: str) -> int:
        # the cohort's sums over all members are computed once per usage version and shared by every
        # member (each member's own part is subtracted), instead of one pass per member asking
        ck = (c, gpu_type)
        cm = self._cohort_sums.get(ck)
        if cm is None or cm[0] != ws.usage_version:
            parts: dict[str, tuple[int, int]] = {}
            pool_all = borrowed_all = 0
            usage = ws.usage
            members = self._members.get(ck)
            if members is None:  # per member: usage key, nominal, lending limit (static: once per book)
                members = []
                u = unit(gpu_type)
                for name in self.cohorts.get(c, ()):
                    qt = self.quota(name, gpu_type)
                    lend = qt.lending_limit if qt is not None else None
                    members.append(
                        (
                            name,
                            (name, gpu_type),
                            qt.nominal * u if qt is not None else 0,
                            lend * u if lend is not None else None,
                        )
                    )
                self._members[ck] = members
            for name, ukey, nominal, lend in members:
                # idle = max(0, nominal - used) capped at the lending limit, borrow = max(0, used - nominal)
                # (conditionals rather than builtin calls: this runs per member after most binds)
                d = nominal - usage.get(ukey, 0)
                idle = d if d > 0 else 0
                if lend is not None and lend < idle:
                    idle = lend
                borrow = -d if d < 0 else 0
                pi, pb = parts.get(name, (0, 0))
                parts[name] = (pi + idle, pb + borrow)  # a name listed twice is skipped twice, as before
                pool_all += idle
                borrowed_all += borrow
            cm = self._cohort_sums[ck] = (ws.usage_version, pool_all, borrowed_all, parts)
        _v, pool_all, borrowed_all, parts = cm
        own = parts.get(q.name)
        if own is not None:
            pool_all -= own[0]
            borrowed_all -= own[1]
        avail = pool_all - borrowed_all
        return avail if avail > 0 else 0


def _refusal(gpu_type: str, form: str, who: str, *amounts: int | None) -> str:
    """A refusal's sentence: ``form``'s first field is the queue or org, the rest ``amounts`` in usage
    units shown as ``amount_text`` does (a None field is where the resource's name goes)."""
    return form.format(
        who, *(resource_units(gpu_type) if a is None else amount_text(gpu_type, a) for a in amounts)
    )
