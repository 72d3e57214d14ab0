"""One stop step for the whole gang, agreed through the shared checkpoint folder.

The node agents SIGTERM every rank of a preempted or drained gang, but not at the same instant: ranks
that each saved the step they happened to be at saved different steps (rank 1 step 141, rank 0 step
140), so no step ever had every shard and rank 0 waited for one until the SIGKILL at the end of the
grace. Ranks without a collective library (the numpy example has none) agree here instead:

1. At its first step boundary after it learns of the stop (its own SIGTERM, or the folder below
   appearing because a peer published), a rank writes the number of steps it has completed to a small
   file of its own, ``<checkpoint dir>/.stop/attempt-<A>/rank-<R>.json``, and trains no further.
2. It waits until every rank of the attempt has published. The stop step is the largest published
   step: no rank is past it (each waits at the step it published), so every rank can reach it, the
   ones behind by training on, and all save that same step.

Ranks that train with torch.distributed (DDP) agree by an all-reduce on its default group instead
(``collective_stop``): they already meet at every step, and a rank waiting here for a file while its
peer waits in an all-reduce would hang both until the SIGKILL.

Files live under the attempt's number, so a relaunched attempt never reads a stop of the one before.
A rank that has not published within ``timeout_s`` (dead, or too slow for the grace) cannot be waited
for: the rank stops at its own step, and the log says which ranks were missing.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path

from .files import read_json, write_atomic

STOP_DIR = ".stop"
POLL_S = 0.01

_log = logging.getLogger("rallypoint.ckpt")


def collective_stop(asked: bool) -> bool | None:
    """Whether any rank asked to stop, all-reduced on torch.distributed's default group; None when this
    process has no initialized group. torch is only looked up, never imported: the client stays light,
    and a loop that has a process group has imported it already."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    torch = sys.modules["torch"]
    on_gpu = dist.get_backend() == "nccl"  # NCCL reduces only GPU tensors
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    flag = torch.tensor([int(asked)], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class StopAgreement:
    """One rank's part in agreeing on the gang's stop step, for one attempt."""

    def __init__(
        self, directory: Path, *, rank: int, world_size: int, attempt: int, timeout_s: float
    ) -> None:
        self.folder = directory / STOP_DIR / f"attempt-{attempt}"
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.agreed: int | None = None

    def peer_stopping(self) -> bool:
        """Whether a rank of this attempt has published its stop step (one stat, cheap enough per step)."""
        return self.folder.is_dir()

    def agree(self, step: int, *, since: float) -> int:
        """Publish ``step`` (the steps this rank has completed), wait for every rank's; the stop step.

        ``since``: when this rank learned of the stop (``time.monotonic()``); the wait ends
        ``timeout_s`` after it. Idempotent: later calls return the step agreed first."""
        if self.agreed is None:
            self._publish(step)
            published = self._await_all(deadline=since + self.timeout_s)
            self.agreed = step if published is None else max(published)
            _log.info("rank %d stops at step %d (completed %d when it stopped)", self.rank, self.agreed, step)
        return self.agreed

    def clear(self) -> None:
        """Remove this attempt's stop files: for the committer once the stop step is committed (every rank
        has agreed by then), so a later run with the same attempt number starts clean."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _file(self, rank: int) -> Path:
        return self.folder / f"rank-{rank:05d}.json"

    def _publish(self, step: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self._file(self.rank), json.dumps({"rank": self.rank, "step": step}).encode())

    def _published(self, rank: int) -> int | None:
        record = read_json(self._file(rank))
        if record is None or record.get("rank") != rank or not isinstance(record.get("step"), int):
            return None
        step: int = record["step"]
        return step

    def _await_all(self, *, deadline: float) -> list[int] | None:
        """Every rank's published step, in rank order; None if some rank has not published by ``deadline``."""
        found: dict[int, int] = {}
        while True:
            for rank in range(self.world_size):
                if rank not in found and (step := self._published(rank)) is not None:
                    found[rank] = step
            if len(found) == self.world_size:
                return [found[rank] for rank in range(self.world_size)]
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(found))
                _log.warning(
                    "rank %d: ranks %s published no stop step within %ss: stopping at its own step, "
                    "which cannot commit",
                    self.rank,
                    missing,
                    self.timeout_s,
                )
                return None
            time.sleep(POLL_S)
