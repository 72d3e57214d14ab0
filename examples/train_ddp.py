"""A real DDP job on the gloo backend (CPU), checkpointed with DCP through ``rallypoint.ckpt.torch_dcp``.

The torchrun contract from the environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and the
Rallypoint variables, RALLY_CHECKPOINT_DIR first). Seeded model, each rank's batch at a step from
(step, rank) alone, and gradients summed in an order every process repeats (a communication hook,
rallypoint.ckpt.torch_ddp), so a run killed or stopped and resumed from its checkpoints ends with the
same parameters, bit for bit, as an uninterrupted run (tested at 2, 4 and 8 ranks). At the end each
rank writes the sha256 of the final parameters to ``$RALLY_CHECKPOINT_DIR/final-rank-<RANK>.sha256``.

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 RALLY_CHECKPOINT_DIR=/tmp/ck \\
        python examples/train_ddp.py --steps 50 &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 RALLY_CHECKPOINT_DIR=/tmp/ck \\
        python examples/train_ddp.py --steps 50

SIGTERM on any rank: every rank saves at the next step boundary, waits for the commit and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import torch
import torch.distributed as dist
from loop_args import loop_parser  # beside this file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rallypoint.ckpt.torch_dcp import DcpCheckpointer
from rallypoint.ckpt.torch_ddp import reduce_each_parameter


def parse(argv: list[str] | None) -> argparse.Namespace:
    return loop_parser(__doc__, steps=50, step_time=0.0, ckpt_every=10).parse_args(argv)


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial weights on every rank and every attempt
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    # DDP's own all-reduce sums a gradient in an order that depends on its place in a bucket, and a
    # resumed process's first step has other buckets than an uninterrupted one (torch_ddp.py): at 3
    # ranks or more its parameters drifted from the uninterrupted run's. Reduced one parameter at a
    # time, every gradient is summed in the same order in every process of the run.
    model.register_comm_hook(None, reduce_each_parameter)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data at ``step``: from (step, rank) only, never from the clock or the past."""
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    x = torch.randn(32, 16, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int) -> None:
    x, y = batch(step, rank)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()  # DDP all-reduces the gradients here
    optimizer.step()


def digest(model: nn.Module) -> str:
    sha = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt = DcpCheckpointer.from_env()
    ckpt.install_sigterm_handler()
    model, optimizer = build()
    start = ckpt.load_latest(model, optimizer) or 0
    if start:
        print(f"rank {rank}: resumed from step {start}", flush=True)
    for step in range(start, args.steps):
        began = time.monotonic()
        train_step(model, optimizer, step, rank)
        time.sleep(args.step_time)
        done = step + 1
        ckpt.report_step(done, time.monotonic() - began)
        stopping = ckpt.should_stop_all()  # a SIGTERM on any rank stops every rank at this step
        if done % args.ckpt_every == 0 or stopping:
            ckpt.save(done, model, optimizer)
        if stopping:
            ckpt.close()
            print(f"rank {rank}: stopped at step {done} after a checkpoint", flush=True)
            dist.destroy_process_group()
            return 0
    ckpt.close()
    final = digest(model)
    ckpt.ckpt.directory.mkdir(parents=True, exist_ok=True)
    (ckpt.ckpt.directory / f"final-rank-{rank}.sha256").write_text(final + "\n")
    print(f"rank {rank}: done, final parameters {final[:16]}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
