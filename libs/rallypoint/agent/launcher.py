"""The rank launcher: real OS processes for every rank, supervised through the work directory.

The launcher keeps no state that matters in memory: everything it knows is in ``workdir`` files, so a
new launcher on the same directory (an agent restart) re-adopts running ranks and reports the exits
that happened while nobody was watching. The agent drives it:

- ``launch(task)``  start the ranks of a task; ranks already started are never started again; a rank of
  another attempt still on one of its GPUs is stale (the log gave the GPU away) and is SIGKILLed first;
- ``kill(job, attempt, grace_s)``  SIGTERM to each rank's process group, SIGKILL once the grace is over;
- ``poll()``  called every ~0.1-0.5 s: reaps, escalates kills, returns exits not yet handed out;
- ``mark_reported(exit)``  after RankExited is safely in the log, so a restart does not report it again;
- ``status()``  every rank this node knows about;
- ``report_sources()``  the ranks' report files the agent should tail (``reports``).

Reaping: exit codes come from the exit files the wrappers write, never from wait statuses, so reaping
is only about leaving no zombie. Every wrapper ``Popen`` stays in ``_children`` until ``poll()`` has
seen it gone (a wrapper writes its exit file a moment *before* it exits, so one look at exit time is
not enough); wrappers spawned by an earlier launcher in this process are reaped by pid; with
``reap_orphans`` (the agent process, PID 1 in its container) re-parented orphans are reaped too.

Methods are thread-safe (one lock) so the asyncio agent can run them in worker threads: they fsync.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from rallypoint.agent import workdir
from rallypoint.agent.backend import MigUnavailable
from rallypoint.agent.reaper import OrphanReaper, reap_child
from rallypoint.agent.reports import ReportSource
from rallypoint.events import MigSlice
from rallypoint.jobs.launch import rank_environment
from rallypoint.protocol import LaunchTask, RankStatus

_log = logging.getLogger(__name__)

# A claim without a pid file is a wrapper still starting (Python starts in well under a second); after
# this long with no wrapper alive to show for it, the rank is declared lost instead of waited on forever.
STARTUP_GRACE_S = 10.0
# A rank's report file is still tailed this long after its exit was reported: a helper process it left
# behind may append a last line (which then lands after the RankExited, but is not lost).
REPORT_LINGER_S = 30.0
# Finding orphans means reading every /proc/<pid>/stat of the host: not on every poll.
ORPHAN_SWEEP_INTERVAL_S = 2.0
# How long a launch waits for the stale ranks it SIGKILLed to exit and free its GPUs (normally
# milliseconds); past it the launch goes ahead and says which ranks still hold them.
EVICTION_WAIT_S = 10.0


@dataclass(frozen=True)
class RankExit:
    """A finished rank, ready to become a ``RankExited`` event."""

    job_id: str
    attempt: int
    rank: int
    exit_code: int
    at: float


@dataclass(frozen=True)
class LaunchOutcome:
    started: tuple[int, ...]
    already: tuple[int, ...]
    #: (job, attempt) of the stale ranks stopped first because they held GPUs of this task
    evicted: tuple[tuple[str, int], ...] = ()
    #: a newer attempt of the job runs here: nothing was started (a launch that came too late)
    superseded_by: int | None = None

    @property
    def already_running(self) -> bool:
        """Nothing new was started: the whole task had been launched before (a resent command)."""
        return not self.started and bool(self.already)


@dataclass
class _Rank:
    job_id: str
    attempt: int
    rank: int
    directory: Path
    gpus: tuple[int, ...] = ()
    shared: bool = False  # a fractional or MIG job's rank: its GPU runs other such jobs' ranks too
    popen: subprocess.Popen[bytes] | None = None  # only for wrappers this launcher spawned itself
    claimed_at: float = 0.0
    wrapper_pid: int | None = None
    wrapper_start: int | None = None
    pid: int | None = None
    pid_start: int | None = None
    exit: RankExit | None = None
    handed_out: bool = False
    reported: bool = False
    term_sent: bool = False
    kill_deadline: float | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.rank)

    def file(self, kind: str) -> Path:
        return workdir.rank_file(self.directory, self.rank, kind)


class RankLauncher:
    """Starts, watches, kills and re-adopts rank processes under ``work_dir``."""

    def __init__(
        self,
        work_dir: Path | str,
        *,
        python: str = sys.executable,
        clock: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
        reap_orphans: bool = False,
        run_as: str | None = None,
        shared_paths: Sequence[Path] = (),
        mig_device: Callable[[int, str, int], str] | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        # the backend's ``mig_device``: the UUID of a MIG rank's slice (made when it does not exist yet)
        self._mig_device = mig_device
        # the user ranks run as when this process is root (rankuser); None: this process's own user
        self._run_as = run_as
        # folders every rank may reach besides its own (datasets, a scratch space): its sandbox shows them
        self._shared = tuple(str(Path(p).absolute()) for p in shared_paths)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # Only the agent enters its work dir: every job's task file (its env) and logs are in it. A rank
        # reaches its own attempt's folder alone, through its sandbox (``ranksandbox``).
        self.work_dir.chmod(0o700)
        self._python = python
        self._clock = clock
        self._base_env = base_env
        self._ranks: dict[tuple[str, int, int], _Rank] = {}
        # wrapper pid -> handle, kept until the wrapper is reaped (a rank's record keeps its own too)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # wrapper pid -> start time: our children by an earlier launcher in this process, no handle
        self._strays: dict[int, int | None] = {}
        self._orphans = OrphanReaper() if reap_orphans else None
        self._next_sweep = 0.0
        self._lock = threading.Lock()
        self.adopt()

    # -- public API ---------------------------------------------------------------------------------

    def adopt(self) -> int:
        """Scan the work dir for ranks this object does not know yet; returns how many were found.

        Runs at construction, so a restarted agent sees every rank of every attempt: running ones are
        watched again, finished-but-unreported ones come out of the next ``poll()``.
        """
        found = 0
        with self._lock:
            for job_dir in sorted(p for p in self.work_dir.iterdir() if p.is_dir()):
                for attempt_dir in sorted(p for p in job_dir.iterdir() if p.is_dir() and p.name.isdigit()):
                    task = self._read_task(attempt_dir)
                    for claim in sorted(attempt_dir.glob("rank-*.claim")):
                        try:
                            rank = int(claim.name[len("rank-") : -len(".claim")])
                        except ValueError:
                            continue
                        key = (job_dir.name, int(attempt_dir.name), rank)
                        if key in self._ranks:
                            continue
                        record = _Rank(
                            job_id=key[0],
                            attempt=key[1],
                            rank=rank,
                            directory=attempt_dir,
                            gpus=_gpus_of(task, rank),
                            shared=task is not None and _shares_its_gpu(task),
                        )
                        self._load(record)
                        self._ranks[key] = record
                        found += 1
        return found

    def launch(self, task: LaunchTask) -> LaunchOutcome:
        newer = self._newer_attempt(task)
        if newer is not None:
            # a launch that arrives late, after the log moved the job on and this node started the next
            # attempt: starting it would put two attempts on the same GPUs, evicting would kill the live one
            _log.warning(
                "not launching %s attempt %d: attempt %d runs here", task.job_id, task.attempt, newer
            )
            return LaunchOutcome(started=(), already=(), superseded_by=newer)
        evicted = self._evict(task)
        directory = workdir.attempt_dir(self.work_dir, task.job_id, task.attempt)
        started: list[int] = []
        already: list[int] = []
        with self._lock:
            directory.mkdir(parents=True, exist_ok=True)
            task_file = directory / "task.json"
            if not task_file.exists():
                # the task as written down holds no secret: the spawned ranks' environment alone has them
                task_record = msgspec.to_builtins(task.without_secrets())
                workdir.write_atomic(task_file, task_record, exclusive=True)
            for spec in task.ranks:
                key = (task.job_id, task.attempt, spec.rank)
                if key in self._ranks:
                    already.append(spec.rank)
                    continue
                record = _Rank(
                    job_id=task.job_id,
                    attempt=task.attempt,
                    rank=spec.rank,
                    directory=directory,
                    gpus=tuple(spec.gpus),
                    shared=_shares_its_gpu(task),
                )
                now = self._clock()
                # The claim is the idempotency key on disk: created exclusively *before* the spawn, so
                # neither a resent command nor a restarted agent can ever start this rank twice.
                if not workdir.write_atomic(record.file("claim"), {"at": now}, exclusive=True):
                    self._load(record)
                    self._ranks[key] = record
                    already.append(spec.rank)
                    continue
                record.claimed_at = now
                self._ranks[key] = record
                # Built from an allow-list, never a copy of ours: the agent's bus credentials stay here.
                env = rank_environment(task, spec, os.environ if self._base_env is None else self._base_env)
                # the training client appends checkpoint commits and step progress here (reports.py)
                env["RALLY_REPORT_FILE"] = str(record.file("report").absolute())
                try:
                    if task.mig is not None:  # the rank sees its slice alone, never the whole GPU
                        env["CUDA_VISIBLE_DEVICES"] = self._slice_device(spec.gpus, task.mig)
                    if task.pty:  # what a terminal program needs to draw; the job's env may say otherwise
                        env.setdefault("TERM", "xterm-256color")
                    self._spawn(record, task.command, env, pty=task.pty)
                except OSError as exc:
                    if not _rank_cannot_exec(exc):
                        raise
                    self._record_exec_failure(record, exc)
                started.append(spec.rank)
        return LaunchOutcome(started=tuple(started), already=tuple(already), evicted=evicted)

    def _slice_device(self, gpus: Sequence[int], cut: MigSlice) -> str:
        """The MIG device UUID of ``cut`` on the rank's one GPU; an ``OSError`` (the rank cannot start,
        recorded as its exit) when this node cannot make it."""
        try:
            if self._mig_device is None or len(gpus) != 1:
                raise MigUnavailable("this agent has no MIG backend")
            return self._mig_device(gpus[0], cut.profile, cut.start)
        except MigUnavailable as exc:
            raise OSError(errno.ENODEV, f"no MIG device {cut.profile} at slice {cut.start}: {exc}") from exc

    def _newer_attempt(self, task: LaunchTask) -> int | None:
        """The newest attempt of the task's job with a rank running here, if newer than the task's."""
        with self._lock:
            attempts = [r.attempt for r in self._ranks.values() if r.job_id == task.job_id and r.exit is None]
        newest = max(attempts, default=None)
        return newest if newest is not None and newest > task.attempt else None

    def _evict(self, task: LaunchTask) -> tuple[tuple[str, int], ...]:
        """Stop every rank of another attempt that holds a GPU this task's ranks get, and wait until they
        have exited. The log gave those GPUs to this task, so such a rank is stale: its attempt ended
        while this node could not be told (lost, unreachable, a kill that never arrived). Left running,
        it would hold the GPU's memory under the new rank. It gets no grace: its gang has moved on.

        A fractional or MIG task's GPU runs other such jobs' ranks by design: those are not stale."""
        wanted = {gpu for spec in task.ranks for gpu in spec.gpus}
        if not wanted:
            return ()
        with self._lock:
            now = self._clock()
            live = [r for r in self._ranks.values() if r.exit is None]
            attempts = tuple(
                sorted(
                    {
                        (r.job_id, r.attempt)
                        for r in live
                        if (r.job_id, r.attempt) != (task.job_id, task.attempt)
                        and wanted.intersection(r.gpus)
                        and not (r.shared and _shares_its_gpu(task))
                    }
                )
            )
            # the whole stale attempt: its other ranks here are as stale, and hold GPUs the log has freed
            squatters = [r for r in live if (r.job_id, r.attempt) in attempts]
            for job_id, attempt in attempts:
                held = {g for r in squatters if (r.job_id, r.attempt) == (job_id, attempt) for g in r.gpus}
                _log.warning(
                    "%s attempt %d still runs here, on GPUs %s of which %s go to %s attempt %d: killing it",
                    job_id, attempt, sorted(held), sorted(held & wanted), task.job_id, task.attempt,
                )  # fmt: skip
            for record in squatters:
                self._kill_now(record, now)
        self._await_exits(squatters, EVICTION_WAIT_S)
        return attempts

    def _kill_now(self, record: _Rank, now: float) -> None:
        """SIGKILL a rank at once, whatever kill was asked of it before (lock held)."""
        workdir.write_atomic(record.file("kill"), {"requested_at": now, "grace_s": 0.0})
        record.kill_deadline = now
        self._refresh_pids(record)
        self._enforce_kill(record, now)

    def _await_exits(self, records: list[_Rank], timeout: float) -> None:
        """Until every one of ``records`` has exited (its exit recorded, handed out by a later poll)."""
        deadline = time.monotonic() + timeout
        while records:
            with self._lock:
                self._reap()
                now = self._clock()
                for record in records:
                    if record.exit is None:
                        self._watch(record, now)
                records = [r for r in records if r.exit is None]
            if not records:
                return
            if time.monotonic() >= deadline:
                held = ", ".join(f"{r.job_id} attempt {r.attempt} rank {r.rank}" for r in records)
                _log.error("still running %.0f s after SIGKILL, holding GPUs: %s", timeout, held)
                return
            time.sleep(0.02)

    def kill(self, job_id: str, attempt: int, grace_s: float = 5.0) -> int:
        """Stop every unfinished rank of (job, attempt); returns how many were signalled or marked.

        The request is written to disk first, so a rank whose wrapper is still starting will not start
        its command, and an agent that restarts mid-grace still delivers the SIGKILL.
        """
        count = 0
        now = self._clock()
        with self._lock:
            for record in self._ranks.values():
                if (record.job_id, record.attempt) != (job_id, attempt) or record.exit is not None:
                    continue
                existing = workdir.read_record(record.file("kill"))
                if existing is None:
                    existing = {"requested_at": now, "grace_s": max(0.0, grace_s)}
                    workdir.write_atomic(record.file("kill"), existing)
                record.kill_deadline = float(existing["requested_at"]) + float(existing["grace_s"])
                self._refresh_pids(record)
                self._enforce_kill(record, now)
                count += 1
        return count

    def poll(self) -> list[RankExit]:
        """Reap, escalate pending kills, and return exits not handed out before by this launcher."""
        fresh: list[RankExit] = []
        now = self._clock()
        with self._lock:
            self._reap()
            for record in self._ranks.values():
                if record.exit is None:
                    self._watch(record, now)
                if record.exit is not None and not record.handed_out and not record.reported:
                    record.handed_out = True
                    fresh.append(record.exit)
        return fresh

    def unreported(self) -> list[RankExit]:
        """Every known exit whose RankExited is not confirmed in the log yet (handed out or not)."""
        with self._lock:
            return [r.exit for r in self._ranks.values() if r.exit is not None and not r.reported]

    def mark_reported(self, exit: RankExit) -> None:
        with self._lock:
            record = self._ranks.get((exit.job_id, exit.attempt, exit.rank))
            if record is None or record.reported:
                return
            workdir.write_atomic(record.file("reported"), {"at": self._clock()})
            record.reported = True

    def status(self) -> tuple[RankStatus, ...]:
        with self._lock:
            return tuple(
                RankStatus(
                    job_id=r.job_id,
                    attempt=r.attempt,
                    rank=r.rank,
                    pid=r.pid or 0,
                    exit_code=r.exit.exit_code if r.exit else None,
                )
                for r in sorted(self._ranks.values(), key=lambda r: r.key)
            )

    def report_sources(self) -> list[ReportSource]:
        """The report files that may still hold news: of ranks running, exited but not reported yet
        (their last lines go in before their exit), or exited within ``REPORT_LINGER_S``."""
        now = self._clock()
        with self._lock:
            return [
                ReportSource(r.job_id, r.attempt, r.rank, r.file("report"), r.file("report-offset"))
                for r in sorted(self._ranks.values(), key=lambda r: r.key)
                if r.exit is None or not r.reported or now - r.exit.at < REPORT_LINGER_S
            ]

    def busy_gpus(self) -> set[int]:
        """GPU indices held by ranks that have not exited (for the simulated backend's utilization)."""
        with self._lock:
            return {g for r in self._ranks.values() if r.exit is None for g in r.gpus}

    def terminal_path(self, job_id: str, attempt: int, rank: int) -> Path | None:
        """The socket of a running interactive rank's terminal (``ptyhost``); None when this node runs no
        such rank of that attempt, or it has exited."""
        with self._lock:
            record = self._ranks.get((job_id, attempt, rank))
            if record is None or record.exit is not None:
                return None
            path = record.file("tty")
        return path if path.exists() else None

    def published(self, job_id: str, attempt: int, rank: int) -> tuple[tuple[int, ...], int] | None:
        """The ports a running rank's job publishes and the rank's pid (``agent.terminal`` forwards them);
        None when this node runs no such rank of that attempt, or its process is not known yet."""
        with self._lock:
            record = self._ranks.get((job_id, attempt, rank))
            if record is None or record.exit is not None:
                return None
            self._refresh_pids(record)  # a rank just started: its pid file is there before the next poll
            if record.pid is None:
                return None
            directory, pid = record.directory, record.pid
        task = self._read_task(directory)
        return (task.ports if task is not None else ()), pid

    def hang_up(self, job_id: str, attempt: int, rank: int, note: str) -> bool:
        """A terminal's hang-up for a running rank (its session's client never came back): ``note`` at the
        end of its log, then SIGHUP to its group, which ends a shell as a dropped line would. False: no
        such rank runs here."""
        with self._lock:
            record = self._ranks.get((job_id, attempt, rank))
            if record is None or record.exit is not None or record.pid is None:
                return False
            with open(record.file("log"), "a", encoding="utf-8") as log:
                log.write(f"\nrally agent: {note}\n")
            return workdir.signal_group(record.pid, record.pid_start, signal.SIGHUP)

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return workdir.rank_file(workdir.attempt_dir(self.work_dir, job_id, attempt), rank, "log")

    def forget_processes(self) -> None:
        """Drop our handles on wrapper processes without touching them (tests: simulate an agent crash)."""
        with self._lock:
            for record in self._ranks.values():
                record.popen = None
            self._children.clear()

    def unreaped(self) -> int:
        """Wrappers spawned or adopted by this launcher that have not been reaped yet."""
        with self._lock:
            return len(self._children) + len(self._strays)

    # -- internals (lock held) ----------------------------------------------------------------------

    def _spawn(
        self, record: _Rank, command: tuple[str, ...], env: dict[str, str], *, pty: bool = False
    ) -> None:
        argv = [
            self._python,
            "-m",
            "rallypoint.agent.rankwrap",
            "--dir",
            str(record.directory.absolute()),  # the wrapper starts in that folder
            "--rank",
            str(record.rank),
            *(["--user", self._run_as] if self._run_as else []),
            *(f"--reach={path}" for path in self._shared if self._run_as),
            *(["--pty"] if pty else []),
            "--",
            *command,
        ]
        with open(record.file("log"), "ab") as log:
            # A session of its own: Ctrl-C on the agent's terminal, or the agent's death, must not
            # reach the rank. The wrapper's own output goes to the rank log, where a human looks.
            record.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # not the agent's own folder, where its configuration may lie
                cwd=record.directory,
                start_new_session=True,
                close_fds=True,
            )
        self._children[record.popen.pid] = record.popen
        record.wrapper_pid = record.popen.pid
        record.wrapper_start = workdir.process_start_time(record.popen.pid)

    def _record_exec_failure(self, record: _Rank, exc: OSError) -> None:
        """The rank's own command or environment made exec fail: record it as the rank's exit (126, the
        shell's "cannot execute"), with the reason in its log, so the job's attempt fails with it instead
        of a claim that never starts (and turns into a lost rank, blamed on the node, much later)."""
        with open(record.file("log"), "a", encoding="utf-8") as log:
            log.write(f"rankwrap: cannot start rank {record.rank}: {exc.strerror} (errno {exc.errno})\n")
        exit_record = {"exit_code": workdir.EXIT_NOT_EXECUTABLE, "at": self._clock()}
        workdir.write_atomic(record.file("exit"), exit_record, exclusive=True)
        self._read_exit(record)

    def _reap(self) -> None:
        for pid, popen in list(self._children.items()):
            if popen.poll() is not None:
                del self._children[pid]
        for pid, start in list(self._strays.items()):
            if reap_child(pid, start):
                del self._strays[pid]
        if self._orphans is not None and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + ORPHAN_SWEEP_INTERVAL_S
            self._orphans.sweep(owned=self._children.keys() | self._strays.keys())

    def _read_task(self, directory: Path) -> LaunchTask | None:
        try:
            return msgspec.json.decode((directory / "task.json").read_bytes(), type=LaunchTask)
        except (OSError, msgspec.DecodeError):
            return None

    def _load(self, record: _Rank) -> None:
        """Fill a record from its files (adoption, or a claim that already existed on disk)."""
        claim = workdir.read_record(record.file("claim")) or {}
        record.claimed_at = float(claim.get("at", 0.0))
        record.reported = record.file("reported").exists()
        self._refresh_pids(record)
        kill = workdir.read_record(record.file("kill"))
        if kill is not None:
            record.kill_deadline = float(kill["requested_at"]) + float(kill["grace_s"])
        self._read_exit(record)

    def _refresh_pids(self, record: _Rank) -> None:
        if record.pid is not None:
            return
        pids = workdir.read_record(record.file("pid"))
        if pids is None:
            return
        record.wrapper_pid = pids.get("wrapper_pid")
        record.wrapper_start = pids.get("wrapper_start")
        record.pid = pids.get("pid")
        record.pid_start = pids.get("pid_start")
        if record.popen is None and record.wrapper_pid:
            # Spawned by an earlier launcher: if that was in this process, the wrapper is our child and
            # nobody else will reap it (``reap_child`` lets go of it at once if it is not ours).
            self._strays[record.wrapper_pid] = record.wrapper_start

    def _read_exit(self, record: _Rank) -> bool:
        data = workdir.read_record(record.file("exit"))
        if data is None:
            return False
        record.exit = RankExit(
            job_id=record.job_id,
            attempt=record.attempt,
            rank=record.rank,
            exit_code=int(data["exit_code"]),
            at=float(data["at"]),
        )
        return True

    def _wrapper_alive(self, record: _Rank) -> bool:
        if record.popen is not None:
            return record.popen.poll() is None
        return workdir.same_process(record.wrapper_pid, record.wrapper_start)

    def _watch(self, record: _Rank, now: float) -> None:
        try:
            self._check(record, now)
            if record.exit is None and record.kill_deadline is not None:
                self._refresh_pids(record)
                self._enforce_kill(record, now)
        except OSError as exc:
            # One rank's unwritable file (disk full) must not cost the exits already handed out in
            # this pass: they would never come out of poll() again in this process.
            _log.warning("watching rank %d of %s failed: %s", record.rank, record.job_id, exc)

    def _check(self, record: _Rank, now: float) -> None:
        if self._read_exit(record):
            return
        self._refresh_pids(record)
        if self._wrapper_alive(record):
            return
        # The wrapper may have written its exit file between our two looks.
        if self._read_exit(record):
            return
        if record.wrapper_pid is None and now - record.claimed_at < STARTUP_GRACE_S:
            return  # claimed by an agent that died right after; give a slow start the benefit of the doubt
        # Nobody will ever write this rank's exit: make sure nothing of it still runs, then record the
        # loss ourselves (exclusively: if the wrapper got there first, its code wins).
        workdir.signal_group(record.pid, record.pid_start, signal.SIGKILL)
        workdir.write_atomic(record.file("exit"), {"exit_code": workdir.EXIT_LOST, "at": now}, exclusive=True)
        self._read_exit(record)

    def _enforce_kill(self, record: _Rank, now: float) -> None:
        if record.pid is None or record.kill_deadline is None:
            return  # the wrapper will see the kill file, or we signal on a later poll once the pid is known
        if now >= record.kill_deadline:
            workdir.signal_group(record.pid, record.pid_start, signal.SIGKILL)
        elif not record.term_sent:
            workdir.signal_group(record.pid, record.pid_start, signal.SIGTERM)
            record.term_sent = True


def _rank_cannot_exec(exc: OSError) -> bool:
    """Exec failed because of what the job asked for: arguments and environment over the kernel's limits
    (E2BIG), or a MIG slice this node cannot make (ENODEV, ``_slice_device``: the attempt fails with the
    reason in the rank's log rather than a launch retried forever). Other failures (no memory, no processes
    left) are the node's, and stay the launch's error."""
    return exc.errno in (errno.E2BIG, errno.ENODEV)


def _shares_its_gpu(task: LaunchTask) -> bool:
    """A fractional job's task (a share of its GPU) or a MIG job's (a slice of it)."""
    return task.gpu_milli > 0 or task.mig is not None


def _gpus_of(task: LaunchTask | None, rank: int) -> tuple[int, ...]:
    if task is None:
        return ()
    for spec in task.ranks:
        if spec.rank == rank:
            return tuple(spec.gpus)
    return ()
