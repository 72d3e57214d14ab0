"""The canonical workload format: JSON Lines, one job a line.

Fields (seconds everywhere):

``id`` (str), ``submit``, ``gpus`` (total), ``gpus_per_task`` (default ``min(gpus, 8)``), ``duration`` (what
the job runs with its full allocation), ``time_limit`` (the user's estimate, optional), ``team``, ``priority``
(a priority class name, optional), ``min_gpus`` / ``max_gpus`` / ``gpu_step`` (elastic, optional),
``checkpoint_interval`` (optional), ``gpu_type`` (optional; ``"A|B"`` allows either model, preferring them in
that order: the core gets ``PendingJob.gpu_types``), ``name`` (default the id), ``depends_on``
(``[{"kind": "after-ok", "job_id": "j1"}]``, the live API's kinds; each job waited for arrives first) and
``singleton`` (optional; held as the live fold holds them, ``sim/holds.py``), ``cpu_milli`` / ``memory_mib``
(per task) and ``gpu_milli`` (a fraction of one GPU; ``gpus`` is then 1), as the live spec has them;
``user`` (optional: who submitted it; fair share between a team's users, docs/scheduling-core.md);
``suspend_at`` / ``resume_at`` (optional: its team suspends it then, and resumes it later or never);
``kind`` (``batch``, the default, or ``service``: it never completes; each run lasts ``duration`` and then its
ranks exit, and it starts again after the job controller's retry backoff, as a live service does; it takes
no ``time_limit`` and is never preempted).

Line order is meaningful: jobs submitted in the same second keep file order (the golden peers do too), so the
loader keeps a ``seq`` per job and never re-sorts by anything but ``(submit, seq)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from rallypoint.events import Affinity, ArrayMember, Dependency


class WorkloadError(ValueError):
    """A workload file is malformed; the message names the file and line."""


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    id: str
    submit: float
    gpus: int
    duration: float
    team: str
    gpus_per_task: int | None = None
    time_limit: float | None = None
    priority: str | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    gpu_step: int | None = None
    checkpoint_interval: float | None = None
    gpu_type: str | None = None
    #: the job's name (default: its id); singletons wait for earlier jobs of the same team and name
    name: str | None = None
    #: jobs that must arrive before this one, waited for as a live job's ``depends_on`` (docs/api.md)
    depends_on: tuple[Dependency, ...] = ()
    singleton: bool = False
    #: a member of a job array (the live API's expansion of ``--array``): at most ``max_running`` at once
    array: ArrayMember | None = None
    #: per task: CPU (millicores) and host memory (MiB) its node must have left; a fractional job's share of
    #: its one GPU in thousandths (``JobSpec``'s fields, docs/sharing.md)
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int | None = None
    gpu_memory_mib: int | None = None  # GPU memory of a fractional job (the live spec's ``gpu_memory_mib``)
    #: a MIG slice of this profile (``gpus`` is then 1), as the live spec's ``mig_profile``
    mig_profile: str | None = None
    #: its team suspends it at ``suspend_at`` (``rally suspend``: a running job checkpoints and stops, a
    #: waiting one leaves the queue) and resumes it at ``resume_at`` (back in its original place)
    suspend_at: float | None = None
    resume_at: float | None = None
    #: node labels every task's node must have (the live spec's ``node_selector``)
    node_selector: dict[str, str] = {}
    #: who submitted it (the live API token's user, ``JobSubmitted.submitted_by``): fair share between the
    #: users of its team counts its service to them (``userusage``)
    user: str | None = None
    #: taints of nodes it may run on, and its affinity rules (the live spec's ``tolerations`` / ``affinity``)
    tolerations: tuple[str, ...] = ()
    affinity: tuple[Affinity, ...] = ()
    #: ``service``: runs until the simulation ends, restarted after the backoff each time a run of
    #: ``duration`` ends, never preempted (the live spec's ``kind``, docs/api.md "Services");
    #: ``interactive``: a terminal session of ``duration``, under its own class unless it names one, never
    #: preempted (``rally run --pty``)
    kind: Literal["batch", "service", "interactive"] = "batch"

    @property
    def job_name(self) -> str:
        return self.name if self.name is not None else self.id

    @property
    def task_gpus(self) -> int:
        """GPUs per task (one task lands on one node)."""
        return self.gpus_per_task if self.gpus_per_task is not None else min(self.gpus, 8)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.gpu_type.split("|") if t) if self.gpu_type else ()

    @property
    def elastic(self) -> bool:
        return self.min_gpus is not None or self.max_gpus is not None


def validate_job(job: Job) -> str | None:
    """Return why ``job`` is invalid, or None. Kept separate from decoding so converters can reuse it."""
    if not job.id:
        return "id must be a non-empty string"
    if not (math.isfinite(job.submit) and job.submit >= 0):
        return f"job {job.id}: submit must be a finite number >= 0"
    if job.gpus < 1:
        return f"job {job.id}: gpus must be >= 1"
    if not (math.isfinite(job.duration) and job.duration > 0):
        return f"job {job.id}: duration must be > 0"
    tg = job.task_gpus
    if tg < 1 or job.gpus % tg:
        return f"job {job.id}: gpus ({job.gpus}) must be a multiple of gpus_per_task ({tg})"
    if job.time_limit is not None and job.time_limit <= 0:
        return f"job {job.id}: time_limit must be > 0"
    if job.kind == "service" and job.time_limit is not None:
        return f"job {job.id}: a service runs until cancelled: it takes no time_limit"
    if job.checkpoint_interval is not None and job.checkpoint_interval <= 0:
        return f"job {job.id}: checkpoint_interval must be > 0"
    lo = job.min_gpus if job.min_gpus is not None else job.gpus
    hi = job.max_gpus if job.max_gpus is not None else job.gpus
    step = job.gpu_step if job.gpu_step is not None else tg
    if not (1 <= lo <= job.gpus <= hi):
        return f"job {job.id}: need min_gpus <= gpus <= max_gpus"
    if step < 1 or (hi - lo) % step or (job.gpus - lo) % step:
        return f"job {job.id}: gpu_step must divide max_gpus - min_gpus and gpus - min_gpus"
    return None


_decoder = msgspec.json.Decoder(Job)
_encoder = msgspec.json.Encoder()


def parse_lines(lines: Iterable[str], source: str = "<workload>") -> list[Job]:
    """Decode and validate JSON Lines; blank lines and lines starting with ``#`` are skipped."""
    jobs: list[Job] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            job = _decoder.decode(s)
        except msgspec.DecodeError as e:
            raise WorkloadError(f"{source}:{n}: {e}") from None
        problem = validate_job(job)
        if problem:
            raise WorkloadError(f"{source}:{n}: {problem}")
        if job.id in seen:
            raise WorkloadError(f"{source}:{n}: duplicate job id {job.id!r}")
        seen.add(job.id)
        jobs.append(job)
    problem = dependency_problem(jobs)
    if problem:
        raise WorkloadError(f"{source}: {problem}")
    return jobs


def dependency_problem(jobs: Sequence[Job]) -> str | None:
    """Why the workload's dependencies cannot be replayed, or None: each job a job waits for must arrive
    before it (``(submit, line order)``), as a live job may only wait for jobs that exist; so no cycle."""
    arrival = {j.id: (j.submit, i) for i, j in enumerate(jobs)}
    for i, job in enumerate(jobs):
        for dep in job.depends_on:
            if dep.job_id not in arrival:
                return f"job {job.id} depends on {dep.job_id}, which is not in the workload"
            if arrival[dep.job_id] >= (job.submit, i):
                return f"job {job.id} depends on {dep.job_id}, which does not arrive before it"
    return None


def load_workload(path: str | Path) -> list[Job]:
    """Read a workload file, sorted by ``(submit, line order)``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise WorkloadError(f"cannot read workload {p}: {e.strerror or e}") from None
    jobs = parse_lines(text.splitlines(), str(p))
    if not jobs:
        raise WorkloadError(f"{p}: workload has no jobs")
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
    return [jobs[i] for i in order]


def dump_lines(jobs: Iterable[Job]) -> Iterator[str]:
    for j in jobs:
        yield _encoder.encode(j).decode()


def write_workload(path: str | Path, jobs: Iterable[Job]) -> int:
    n = 0
    with Path(path).open("w") as f:
        for line in dump_lines(jobs):
            f.write(line + "\n")
            n += 1
    return n
