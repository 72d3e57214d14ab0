"""The training side of checkpoints: sharded, asynchronous, atomic saves; verified loads; SIGTERM.

Every rank calls ``save(step, state)`` at the same steps. The state is copied off the training path at
once (the loop only waits for that copy) and written by a background thread: the rank's shard, then its
durable ``.done`` marker. Rank 0 commits the step by writing its manifest once every rank's marker of
this attempt is there. ``load_latest()`` returns the newest step that verifies, falling back to older
complete ones. SIGTERM (preemption, drain) sets ``should_stop``; ``should_stop_at(step)`` turns it into
one stop step for every rank (``stop.py``): the loop saves that step, waits for the commit and exits 0
within the grace period. docs/training-client.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple, Protocol

from .abandoned import remove_abandoned
from .commit import await_markers, build_manifest, write_manifest, write_marker
from .files import fsync_dir
from .manifest import list_steps, shard_name, step_dir, verify_checkpoint
from .numpy_state import SUFFIX, NumpyCodec, State, read_state
from .report import Reporter
from .stop import StopAgreement, collective_stop

_log = logging.getLogger("rallypoint.ckpt")


class ShardCodec(Protocol):
    """How a rank's state becomes files in the step folder."""

    def copy(self, state: Any) -> Any:
        """A private copy, taken on the training path (must not share memory the loop will change)."""

    def write(self, folder: Path, rank: int, state: Any) -> list[str]:
        """Write the copy into ``folder`` durably (fsynced, renamed); the names of the files written."""


class Loaded(NamedTuple):
    step: int
    state: State


class Checkpointer:
    """One rank's checkpoints in a job's shared checkpoint folder."""

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        job_id: str = "",
        attempt: int = 0,
        report_file: str | Path | None = None,
        resume_step: int | None = None,
        commit_timeout_s: float = 300.0,
        max_in_flight: int = 2,
        codec: ShardCodec | None = None,
        stop_timeout_s: float = 20.0,
    ) -> None:
        if not 0 <= rank < world_size or max_in_flight < 1:
            raise ValueError(
                f"need 0 <= rank < world_size and max_in_flight >= 1 (rank {rank}, {world_size})"
            )
        self.directory = Path(directory)
        self.rank, self.world_size, self.job_id, self.attempt = rank, world_size, job_id, attempt
        self.resume_step = resume_step
        self.commit_timeout_s = commit_timeout_s
        self.max_in_flight = max_in_flight
        self.codec: ShardCodec = codec or NumpyCodec(max_in_flight)
        self.reporter = Reporter(report_file, job_id=job_id, attempt=attempt, rank=rank)
        # One writer thread: writes happen in save() order, the same on every rank (a collective writer
        # such as DCP needs that). Commits wait on their own threads, so step N+1 commits even while
        # step N still waits for a slow rank.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rally-ckpt-write")
        self._committer = ThreadPoolExecutor(
            max_workers=max_in_flight, thread_name_prefix="rally-ckpt-commit"
        )
        self._inflight: list[Future[int | None]] = []
        # Steps whose commit (rank 0) has not ended yet: their folders are not abandoned, whatever they hold.
        self._committing: set[int] = set()
        self._committing_lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_since: float | None = None  # time.monotonic() when this rank learned of the stop
        self._stop_agreement = StopAgreement(
            self.directory, rank=rank, world_size=world_size, attempt=attempt, timeout_s=stop_timeout_s
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Checkpointer:
        """The contract the node agent gives every rank (docs/training-client.md)."""
        env = os.environ if environ is None else environ
        resume = env.get("RALLY_RESUME_STEP", "").strip()
        fields: dict[str, Any] = {
            "rank": int(env.get("RANK", "0")),
            "world_size": int(env.get("WORLD_SIZE", "1")),
            "job_id": env.get("RALLY_JOB_ID", ""),
            "attempt": int(env.get("RALLY_ATTEMPT", "0")),
            "report_file": env.get("RALLY_REPORT_FILE") or None,
            "resume_step": int(resume) if resume.isdigit() else None,
        }
        return cls(env.get("RALLY_CHECKPOINT_DIR", "checkpoints"), **(fields | overrides))

    # -- stopping -----------------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """A stop was asked (SIGTERM, ``request_stop``, or a peer's published stop step). A job of several
        ranks stops with ``should_stop_at``, which says at which step."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        if self._stop_since is None:
            self._stop_since = time.monotonic()
        self._stop.set()

    def should_stop_at(self, step: int) -> bool:
        """True at the one step the whole gang stops at: save ``step``, ``close()``, exit 0 (SIGTERM is
        ignored from then on, when our handler is the one installed).

        Call it once per step on every rank, with the steps completed. Once a stop is asked here or
        published by a peer, the rank publishes ``step`` in the checkpoint folder and waits (at most
        ``stop_timeout_s``) for every rank's; the stop step is the largest, and ranks behind it train on
        until they reach it (``stop.py``). A single rank needs no agreement; ranks with an initialized
        torch.distributed process group all-reduce the flag instead, and must call it at the same step."""
        stopping = self._stop_step_reached(step)
        if stopping:
            self._ignore_late_sigterm()
        return stopping

    def _stop_step_reached(self, step: int) -> bool:
        agreement = self._stop_agreement
        if self.world_size == 1:
            return self.should_stop
        collective = collective_stop(self.should_stop)
        if collective is not None:
            return collective  # ranks in lockstep: every one of them is at this step
        if agreement.agreed is None:
            if not self.should_stop and agreement.peer_stopping():
                self.request_stop()  # a peer got its SIGTERM first: this one stops with the gang
            if self._stop_since is None:
                return False
            return step >= agreement.agree(step, since=self._stop_since)
        return step >= agreement.agreed

    def _ignore_late_sigterm(self) -> None:
        """The rank is stopping: a SIGTERM still on its way (the agents signal ranks a moment apart, and
        a rank may have stopped with its peers first) asks for what already happens. Arriving while the
        interpreter exits, where Python puts the default action back, it would turn exit 0 into -15;
        an ignored signal stays ignored. Only our own handler is replaced, and only from the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def install_sigterm_handler(self) -> Any:
        """SIGTERM sets ``should_stop`` instead of killing the process; returns the previous handler."""
        return signal.signal(signal.SIGTERM, self._on_sigterm)

    @contextmanager
    def sigterm(self) -> Iterator[Checkpointer]:
        """``install_sigterm_handler`` for the block, the previous handler restored after it."""
        previous = self.install_sigterm_handler()
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        # Only a flag: the state is consistent at a step boundary, not wherever the signal landed. A
        # repeated SIGTERM returns at once: handlers interrupted by the next signal would nest.
        if self._stop_since is None:
            self.request_stop()

    # -- saving -------------------------------------------------------------------------------------

    def save(self, step: int, state: Any, *, metadata: dict[str, Any] | None = None) -> Future[int | None]:
        """Copy ``state`` now and write it in the background. The future gives the step once committed
        (rank 0) or once this rank's part is durable (other ranks); None if the commit timed out.
        Blocks first while ``max_in_flight`` saves are still in flight (bounded memory for copies)."""
        started = time.time()
        if metadata is not None:
            json.dumps(metadata)  # not JSON: fail here, in the loop, not in the committer
        self._make_room()
        copied = self.codec.copy(state)
        written = self._writer.submit(self._write, step, copied)
        future: Future[int | None] = written
        if self.rank == 0:
            with self._committing_lock:
                self._committing.add(step)
            future = self._committer.submit(self._commit, step, written, metadata, started)
        future.add_done_callback(_log_failure)
        self._inflight.append(future)
        return future

    def wait(self, timeout: float | None = None) -> list[int | None]:
        """Until every save in flight is durable (and committed, on rank 0); re-raises a failed save."""
        pending, self._inflight = self._inflight, []
        return [future.result(timeout) for future in pending]

    def close(self) -> None:
        try:
            committed = self.wait()
            agreed = self._stop_agreement.agreed
            if self.rank == 0 and agreed is not None and agreed in committed:
                self._stop_agreement.clear()  # every rank saved the stop step, so every rank has agreed
        finally:
            self._writer.shutdown(wait=True)
            self._committer.shutdown(wait=True)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _make_room(self) -> None:
        while sum(not f.done() for f in self._inflight) >= self.max_in_flight:
            wait_futures([f for f in self._inflight if not f.done()], return_when=FIRST_COMPLETED)

    def _write(self, step: int, state: Any) -> int | None:
        folder = step_dir(self.directory, step)
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            fsync_dir(folder.parent)  # the step folder's own name must survive a crash too
        files = self.codec.write(folder, self.rank, state)
        write_marker(folder, rank=self.rank, step=step, attempt=self.attempt, files=files)
        return step

    def _commit(
        self, step: int, written: Future[int | None], metadata: dict[str, Any] | None, started: float
    ) -> int | None:
        try:
            committed = self._commit_step(step, written, metadata, started)
        finally:
            with self._committing_lock:
                self._committing.discard(step)
        if committed is not None:
            self.remove_abandoned_steps(below=committed)
        return committed

    def _commit_step(
        self, step: int, written: Future[int | None], metadata: dict[str, Any] | None, started: float
    ) -> int | None:
        written.result()
        folder = step_dir(self.directory, step)
        markers = await_markers(
            folder,
            world_size=self.world_size,
            step=step,
            attempt=self.attempt,
            timeout_s=self.commit_timeout_s,
        )
        if markers is None:
            _log.warning(
                "step %d not committed: not every rank's shard was durable within %ss",
                step,
                self.commit_timeout_s,
            )
            return None
        manifest = build_manifest(
            job_id=self.job_id,
            step=step,
            attempt=self.attempt,
            markers=markers,
            metadata=metadata,
            created_at=time.time(),
        )
        raw = write_manifest(folder, manifest)
        self.reporter.checkpoint(
            step=step,
            path=folder,
            manifest_sha256=hashlib.sha256(raw).hexdigest(),
            size=sum(shard["bytes"] for shard in manifest["shards"]),
            shards=len(manifest["shards"]),
            save_s=time.time() - started,
        )
        return step

    def remove_abandoned_steps(self, below: int | None = None) -> list[int]:
        """Remove the step folders that never committed and never will: older than ``below`` (by default
        the newest committed step on disk) and not a save of this process still committing
        (``abandoned.py``). The committer calls it after each commit and when it resumes; the steps
        removed."""
        if below is None:
            committed = list_steps(self.directory)
            if not committed:
                return []
            below = committed[-1]
        with self._committing_lock:
            in_flight = set(self._committing)
        return remove_abandoned(self.directory, below=below, in_flight=in_flight)

    # -- loading ------------------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The step to resume from: the newest committed step whose shards all verify, or None.

        With ``resume_step`` (``RALLY_RESUME_STEP``, the latest complete step the scheduler's log knows)
        that step is tried first and only older ones after it: every rank gets the same hint, so all
        ranks pick the same step, and the log's lost-work accounting holds. It is still verified.
        """
        for step in self._candidates():
            result = verify_checkpoint(step_dir(self.directory, step))
            if result.ok:
                return step
            _log.warning("checkpoint step %d does not verify (%s): trying an older one", step, result.error)
        return None

    def _candidates(self) -> list[int]:
        steps = list_steps(self.directory)[::-1]
        hint = self.resume_step
        if hint is None:
            return steps
        return ([hint] if hint in steps else []) + [step for step in steps if step < hint]

    def load(self, step: int, rank: int | None = None) -> State:
        """``rank``'s state (this rank's by default) saved at ``step``. Does not verify: see latest_step."""
        rank = self.rank if rank is None else rank
        return read_state(step_dir(self.directory, step) / shard_name(rank, SUFFIX))

    def load_latest(self, rank: int | None = None) -> Loaded | None:
        """(step, state) of the newest checkpoint that verifies (``latest_step``), or None. Rank 0 first
        removes the folders of saves that never committed and a later step superseded."""
        if self.rank == 0:
            self.remove_abandoned_steps()
        step = self.latest_step()
        if step is None:
            return None
        return Loaded(step, self.load(step, rank))

    # -- reporting to the node agent ------------------------------------------------------------------

    def report_step(self, step: int, step_time_s: float) -> None:
        """Progress for the node agent (at most one line a second): stragglers show up there."""
        self.reporter.step(step, step_time_s)


def _log_failure(future: Future[Any]) -> None:
    # The loop sees a failed save only at wait(); the log says so at once.
    if not future.cancelled() and future.exception() is not None:
        _log.error("a checkpoint save failed", exc_info=future.exception())
