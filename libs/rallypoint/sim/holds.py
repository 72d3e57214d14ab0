"""Jobs held by their dependencies or their name, in the simulator as the live fold holds them.

The rule is the fold's (``state.dependencies.kind_status``): ``after`` is met once the job waited for was
placed, ``after-ok`` once it completed, ``after-not-ok`` once it ended any other way, ``after-any`` once it
ended; a singleton waits for every earlier live job of its team and name. A held job does not reach the
core; one whose dependency can no longer be met ends as ``failed`` (live: the job controller's
``JobFailed``), which may in turn break the dependencies of others.
"""

from __future__ import annotations

from collections.abc import Callable

from rallypoint.state.dependencies import kind_status

from .workload import Job

__all__ = ["Holds"]


class Holds:
    """Held jobs by id, how each ended job ended, and the live jobs of each (team, name) by arrival."""

    def __init__(self, placed: Callable[[str], bool]) -> None:
        self._placed = placed  # whether a job's first attempt was given its GPUs
        self.held: dict[str, tuple[int, Job]] = {}
        self.ended: dict[str, str] = {}  # job id -> completed, rejected or failed
        self.failed: list[str] = []  # ended because a dependency could no longer be met, in order
        self._named: dict[tuple[str, str], dict[str, int]] = {}

    def arrive(self, job: Job, seq: int) -> bool:
        """``job`` arrived: True when it is held (it must not be queued yet)."""
        self._named.setdefault((job.team, job.job_name), {})[job.id] = seq
        if job.depends_on or job.singleton:
            self.held[job.id] = (seq, job)
            return True
        return False

    def end(self, job: Job, outcome: str) -> None:
        """``job`` ended (``completed`` or ``rejected``)."""
        self.ended[job.id] = outcome
        named = self._named.get((job.team, job.job_name), {})
        named.pop(job.id, None)

    def release(self) -> list[str]:
        """End the held jobs that can never start, until none more can, then return (in arrival order)
        those now free to be queued; they leave the held set."""
        while self._fail_impossible():
            pass
        in_order = sorted(self.held, key=lambda job_id: self.held[job_id][0])
        free = [job_id for job_id in in_order if self._free(job_id)]
        for job_id in free:
            del self.held[job_id]
        return free

    def _fail_impossible(self) -> bool:
        doomed = [
            (seq, job)
            for seq, job in self.held.values()
            if any(self._status(d.kind, d.job_id) == "never" for d in job.depends_on)
        ]
        for _seq, job in sorted(doomed, key=lambda sj: sj[0]):
            del self.held[job.id]
            self.end(job, "failed")
            self.failed.append(job.id)
        return bool(doomed)

    def _free(self, job_id: str) -> bool:
        seq, job = self.held[job_id]
        if any(self._status(d.kind, d.job_id) != "met" for d in job.depends_on):
            return False
        if job.singleton:
            named = self._named.get((job.team, job.job_name), {})
            return not any(other_seq < seq for other_seq in named.values())
        return True

    def _status(self, kind: str, job_id: str) -> str:
        return kind_status(kind, placed=self._placed(job_id), ended=self.ended.get(job_id))
