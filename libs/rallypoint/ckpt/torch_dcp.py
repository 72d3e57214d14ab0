"""PyTorch adapter: a model and optimizer saved with ``torch.distributed.checkpoint`` (DCP), committed
through the same manifest protocol as every other checkpoint.

Imported only by jobs that use it (``import rallypoint.ckpt`` never imports torch). DCP's sharded save
is collective, so it runs on a process group of its own (gloo, made here) in the checkpointer's one
writer thread: the training loop's collectives on the default group never interleave with it, and every
rank writes its saves in the same order. Each rank's DCP files go to a staging folder of its own inside
the step folder and are renamed into the step folder once durable; the rank's ``.done`` marker lists
exactly those files (rank 0's include DCP's ``.metadata``), and rank 0 commits the manifest.

    ckpt = DcpCheckpointer.from_env()           # after dist.init_process_group(...)
    step = ckpt.load_latest(model, optimizer)   # None on a fresh start
    ...
    ckpt.save(step, model, optimizer)           # clones to CPU now, writes in the background
"""

from __future__ import annotations

import copy
import os
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .client import Checkpointer
from .files import fsync_dir, fsync_path
from .manifest import step_dir


def clone_to_cpu(value: Any) -> Any:
    """A deep copy with every tensor detached and copied to CPU memory (the loop may step right after)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: clone_to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_to_cpu(item) for item in value)
    return copy.deepcopy(value)


class DcpCodec:
    """A ``ShardCodec`` that writes the state with DCP's collective save on ``process_group``."""

    def __init__(self, process_group: dist.ProcessGroup, attempt: int) -> None:
        self.process_group = process_group
        self.attempt = attempt

    def copy(self, state: dict[str, Any]) -> dict[str, Any]:
        copied: dict[str, Any] = clone_to_cpu(state)
        return copied

    def write(self, folder: Path, rank: int, state: dict[str, Any]) -> list[str]:
        # A staging folder per rank and attempt: the files in it are exactly this rank's, and a save
        # killed half-way leaves its pieces there, never under the names a loader reads.
        staging = folder / f".dcp-attempt-{self.attempt}-rank-{rank:05d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        writer = dcp.FileSystemWriter(staging, sync_files=True)
        dcp.save(state, storage_writer=writer, process_group=self.process_group)
        names = sorted(
            path.name for path in staging.iterdir() if path.is_file() and not path.name.endswith(".tmp")
        )
        for name in names:
            fsync_path(staging / name)  # DCP fsyncs its data files; make sure of .metadata too
            os.replace(staging / name, folder / name)
        fsync_dir(folder)
        shutil.rmtree(staging, ignore_errors=True)
        return names


class DcpCheckpointer:
    """A model and optimizer checkpointed with DCP; the rest (stop flag, reports, waits) is ``ckpt``."""

    def __init__(self, ckpt: Checkpointer, process_group: dist.ProcessGroup) -> None:
        self.ckpt = ckpt
        self.process_group = process_group

    @classmethod
    def from_env(cls, **overrides: Any) -> DcpCheckpointer:
        """The rank contract from the environment; call after ``dist.init_process_group``. Every rank
        must call it at the same point: making the checkpoint process group is collective."""
        group = dist.new_group(backend="gloo")
        ckpt = Checkpointer.from_env(**overrides)
        ckpt.codec = DcpCodec(group, ckpt.attempt)
        return cls(ckpt, group)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> Future[int | None]:
        """Clone the model and optimizer state to CPU now; DCP writes it in the background."""
        model_state, optim_state = get_state_dict(model, optimizer)
        return self.ckpt.save(step, {"model": model_state, "optim": optim_state}, metadata=metadata)

    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int | None:
        """Load the newest checkpoint that verifies into ``model`` and ``optimizer``; its step, or None.

        Collective: rank 0 picks the step (``Checkpointer.latest_step``: verified, the resume hint
        first) and tells the others, so every rank loads the same one. Rank 0 first removes the folders
        of saves that never committed and a later step superseded (``remove_abandoned_steps``)."""
        chosen = torch.tensor([-1], dtype=torch.int64)
        if self.ckpt.rank == 0:
            self.ckpt.remove_abandoned_steps()  # saves a kill cut short, superseded by a later commit
            chosen[0] = -1 if (step := self.ckpt.latest_step()) is None else step
        dist.broadcast(chosen, src=0, group=self.process_group)
        if chosen.item() < 0:
            return None
        step = int(chosen.item())
        model_state, optim_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=step_dir(self.ckpt.directory, step), process_group=self.process_group)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return step

    @property
    def should_stop(self) -> bool:
        return self.ckpt.should_stop

    def should_stop_all(self) -> bool:
        """Whether any rank got SIGTERM: collective on the default group, so every rank stops (and
        saves) at the same step. Call it at the same point of every step on every rank."""
        flag = torch.tensor([1 if self.ckpt.should_stop else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def install_sigterm_handler(self) -> Any:
        return self.ckpt.install_sigterm_handler()

    def report_step(self, step: int, step_time_s: float) -> None:
        self.ckpt.report_step(step, step_time_s)

    def wait(self, timeout: float | None = None) -> list[int | None]:
        return self.ckpt.wait(timeout)

    def close(self) -> None:
        self.ckpt.close()
