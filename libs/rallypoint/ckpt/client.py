"""The training side of checkpoints: sharded, asynchronous, atomic saves; verified loads; SIGTERM.

Every rank calls ``save(step, state)`` at the same steps. The state is copied off the training path at
once (the loop only waits for that copy) and written by a background thread: the rank's shard, then its
durable ``.done`` record. Rank 0 commits the step by writing its manifest once every rank's record of
this attempt is there. ``load_latest()`` returns the newest step that verifies, falling back to older
complete ones. SIGTERM (preemption, drain) sets ``should_stop``: the loop saves at the next step
boundary, waits for the commit and exits 0 within the grace period.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .manifest import (
    FORMAT,
    MANIFEST,
    list_steps,
    read_json,
    sha256_file,
    shard_name,
    step_dir,
    verify_checkpoint,
    write_atomic,
)

State = dict[str, Any]


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
    ) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.job_id = job_id
        self.attempt = attempt
        self.report_file = Path(report_file) if report_file else None
        self.resume_step = resume_step
        self.commit_timeout_s = commit_timeout_s
        # two workers: a second save may start while the first still writes or waits for its commit
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rally-ckpt")
        self._inflight: list[Future[int | None]] = []
        self._report_lock = threading.Lock()
        self._last_step_report = 0.0
        self._stop = threading.Event()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Checkpointer:
        """The contract the node agent gives every rank (see docs/training-client.md)."""
        env = dict(os.environ if environ is None else environ)
        resume = env.get("RALLY_RESUME_STEP")
        return cls(
            env.get("RALLY_CHECKPOINT_DIR", "checkpoints"),
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            job_id=env.get("RALLY_JOB_ID", ""),
            attempt=int(env.get("RALLY_ATTEMPT", "0")),
            report_file=env.get("RALLY_REPORT_FILE") or None,
            resume_step=int(resume) if resume else None,
        )

    # -- stopping -----------------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """SIGTERM arrived: save at the next step boundary, ``wait()``, exit 0."""
        return self._stop.is_set()

    def install_sigterm_handler(self) -> None:
        signal.signal(signal.SIGTERM, lambda _signum, _frame: self._stop.set())

    # -- saving -------------------------------------------------------------------------------------

    def save(self, step: int, state: State) -> Future[int | None]:
        """Copy ``state`` now and write it in the background; the future gives the step once committed
        (rank 0) or once this rank's shard is durable (other ranks), None if the commit timed out."""
        started = time.time()
        copied = _copy(state)
        future = self._pool.submit(self._write, step, copied, started)
        self._inflight = [f for f in self._inflight if not f.done()] + [future]
        return future

    def wait(self) -> list[int | None]:
        """Until every save in flight is durable (and committed, on rank 0)."""
        results = [f.result() for f in self._inflight]
        self._inflight = []
        return results

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def _write(self, step: int, state: State, started: float) -> int | None:
        folder = step_dir(self.directory, step)
        folder.mkdir(parents=True, exist_ok=True)
        name = shard_name(self.rank, "npz")
        write_atomic(folder / name, _encode(state))
        record = {"attempt": self.attempt, "rank": self.rank, "file": name}
        record |= {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
        write_atomic(folder / shard_name(self.rank, "done"), json.dumps(record).encode())
        if self.rank != 0:
            return step
        return self._commit(step, folder, started)

    def _commit(self, step: int, folder: Path, started: float) -> int | None:
        records = self._await_records(folder)
        if records is None:
            return None
        manifest = {
            "format": FORMAT,
            "job_id": self.job_id,
            "step": step,
            "attempt": self.attempt,
            "world_size": self.world_size,
            "created_at": time.time(),
            "shards": [{k: r[k] for k in ("rank", "file", "bytes", "sha256")} for r in records],
        }
        raw = json.dumps(manifest, sort_keys=True).encode()
        write_atomic(folder / MANIFEST, raw)
        result = verify_checkpoint(folder)
        self._report(
            kind="checkpoint",
            step=step,
            path=str(folder.resolve()),
            manifest_sha256=result.manifest_sha256,
            bytes=result.bytes,
            shards=result.shards,
            save_s=round(time.time() - started, 6),
        )
        return step

    def _await_records(self, folder: Path) -> list[dict[str, Any]] | None:
        """Every rank's durable record of this attempt, or None past the commit timeout."""
        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            records = [read_json(folder / shard_name(r, "done")) for r in range(self.world_size)]
            if all(r is not None and r.get("attempt") == self.attempt for r in records):
                return [r for r in records if r is not None]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    # -- loading ------------------------------------------------------------------------------------

    def load_latest(self) -> tuple[int, State] | None:
        """(step, this rank's state) of the newest checkpoint that verifies, or None."""
        for step in reversed(list_steps(self.directory)):
            folder = step_dir(self.directory, step)
            if not verify_checkpoint(folder).ok:
                continue  # a missing or corrupt shard: fall back to the previous complete step
            try:
                return step, _decode((folder / shard_name(self.rank, "npz")).read_bytes())
            except (OSError, ValueError):
                continue
        return None

    # -- reporting to the node agent ------------------------------------------------------------------

    def report_step(self, step: int, step_time_s: float) -> None:
        """Progress for the node agent (rate-limited to one line a second): stragglers show up here."""
        now = time.monotonic()
        if now - self._last_step_report < 1.0:
            return
        self._last_step_report = now
        self._report(kind="step", step=step, step_time_s=round(step_time_s, 6))

    def _report(self, **fields: Any) -> None:
        if self.report_file is None:
            return
        line = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "rank": self.rank,
            **fields,
            "at": time.time(),
        }
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        with self._report_lock, open(self.report_file, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def _copy(state: State) -> State:
    """Off the training path: arrays copied (the loop may change them in place right after)."""
    import numpy as np

    return {
        k: (np.array(v, copy=True) if not isinstance(v, bytes | str | int | float) else v)
        for k, v in state.items()
    }


def _encode(state: State) -> bytes:
    import numpy as np

    plain = {k: v for k, v in state.items() if isinstance(v, str | int | float)}
    entries: dict[str, Any] = {"__plain__": np.frombuffer(json.dumps(plain).encode(), dtype=np.uint8)}
    for key, value in state.items():
        if isinstance(value, bytes):
            entries[f"b/{key}"] = np.frombuffer(value, dtype=np.uint8)
        elif not isinstance(value, str | int | float):
            entries[f"a/{key}"] = value
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    return buffer.getvalue()


def _decode(data: bytes) -> State:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        state: State = json.loads(npz["__plain__"].tobytes())
        for key in npz.files:
            if key.startswith("a/"):
                state[key[2:]] = npz[key]
            elif key.startswith("b/"):
                state[key[2:]] = npz[key].tobytes()
    return state
