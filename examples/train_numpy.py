"""A deterministic multi-rank training loop on numpy, checkpointing through ``rallypoint.ckpt``.

Each rank owns a parameter shard updated from (weights, step, rank) alone, never from the wall clock,
so a run killed and resumed from its checkpoints ends bit for bit where an uninterrupted run does. The
ranks do not talk to each other; the checkpoint folder is their only meeting point. At the end each
rank writes the sha256 of its final parameters to ``$RALLY_CHECKPOINT_DIR/final-rank-<RANK>.sha256``.

    RANK=0 WORLD_SIZE=1 RALLY_CHECKPOINT_DIR=/tmp/ck python examples/train_numpy.py --steps 100

SIGTERM (preemption, drain) on any rank: the ranks agree on one stop step through the checkpoint folder
(``Checkpointer.should_stop_at``), every rank saves that step, rank 0 commits it, all exit 0.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np
from loop_args import loop_parser  # beside this file

from rallypoint.ckpt import Checkpointer


def update(weights: np.ndarray, step: int, rank: int) -> np.ndarray:
    """One 'optimizer step': depends only on the weights, the step and the rank."""
    gradient = np.sin(weights + step * 0.001 + rank)
    return weights - 0.01 * gradient


def initial(size: int, rank: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, size) + rank


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = loop_parser(__doc__, steps=100, step_time=0.1, ckpt_every=10)
    parser.add_argument("--size", type=int, default=4096, help="parameters per rank")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    ckpt = Checkpointer.from_env()
    ckpt.install_sigterm_handler()
    resumed = ckpt.load_latest()
    start, weights = (
        (resumed.step, resumed.state["weights"]) if resumed else (0, initial(args.size, ckpt.rank))
    )
    if resumed:
        print(f"rank {ckpt.rank}: resumed from step {start}", flush=True)
    for step in range(start, args.steps):
        began = time.monotonic()
        weights = update(weights, step, ckpt.rank)
        time.sleep(args.step_time)
        done = step + 1
        ckpt.report_step(done, time.monotonic() - began)
        stopping = ckpt.should_stop_at(done)  # the gang's one stop step, the same on every rank
        if done % args.ckpt_every == 0 or stopping:
            ckpt.save(done, {"weights": weights, "step": done})  # copies now, writes in the background
        if stopping:
            ckpt.close()  # the commit, within the grace period
            print(f"rank {ckpt.rank}: stopped at step {done} after a checkpoint", flush=True)
            return 0
    ckpt.close()
    digest = hashlib.sha256(weights.tobytes()).hexdigest()
    ckpt.directory.mkdir(parents=True, exist_ok=True)
    (ckpt.directory / f"final-rank-{ckpt.rank}.sha256").write_text(digest + "\n")
    print(f"rank {ckpt.rank}: done, final state {digest[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
