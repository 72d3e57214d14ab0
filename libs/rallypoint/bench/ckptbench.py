"""How long a checkpoint save blocks the training loop: asynchronous ``save()`` against a synchronous one.

Both go through the same code (copy, shard write, fsync, marker, manifest commit); the synchronous save
waits for the commit, the asynchronous one returns after the copy. Target: ``ratio`` <= 0.1.

    python -m rallypoint.bench.ckptbench --json [--size-mb 64] [--trials 5] [--dir /shared/fs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.ckpt.client import Checkpointer


def bench_blocking(size_mb: int = 64, trials: int = 5, directory: str | Path | None = None) -> dict[str, Any]:
    """Milliseconds the loop is blocked per save, p50 over ``trials``, for one rank saving ``size_mb``."""
    import numpy as np

    state = {"weights": np.random.default_rng(0).random(size_mb * (1 << 20) // 8), "step": 0}
    blocked: dict[str, list[float]] = {"async": [], "sync": []}
    committed_s: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rally-ckpt-bench-", dir=directory) as root,
        Checkpointer(root, job_id="bench") as ckpt,
    ):
        for trial in range(trials):
            began = time.perf_counter()
            future = ckpt.save(2 * trial, state)
            blocked["async"].append(time.perf_counter() - began)
            future.result()  # not counted: the loop would be training meanwhile
            committed_s.append(time.perf_counter() - began)
            began = time.perf_counter()
            ckpt.save(2 * trial + 1, state).result()
            blocked["sync"].append(time.perf_counter() - began)
    async_ms, sync_ms = (statistics.median(blocked[k]) * 1000 for k in ("async", "sync"))
    return {
        "size_mb": size_mb,
        "trials": trials,
        "async_block_ms_p50": round(async_ms, 3),
        "sync_block_ms_p50": round(sync_ms, 3),
        "ratio": round(async_ms / sync_ms, 4),
        # the first save copies into fresh memory; later ones reuse the codec's buffers
        "async_first_block_ms": round(blocked["async"][0] * 1000, 3),
        "async_commit_ms_p50": round(statistics.median(committed_s) * 1000, 3),
        "write_mb_per_s": round(size_mb / (sync_ms / 1000), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=64, help="state size per save (default 64)")
    parser.add_argument("--trials", type=int, default=5, help="saves of each kind (default 5)")
    parser.add_argument("--dir", default=None, help="where to write (default: the system's temp folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.size_mb < 1 or args.trials < 1:
        parser.error("--size-mb and --trials must be at least 1")
    result = bench_blocking(args.size_mb, args.trials, args.dir)
    print(
        json.dumps(result, sort_keys=True)
        if args.json
        else "\n".join(f"{k:22} {v}" for k, v in result.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
