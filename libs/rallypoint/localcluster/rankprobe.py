"""A stand-in training rank: records the environment it was given, sleeps, exits with a chosen code.

`python -m rallypoint.localcluster.rankprobe --out DIR --sleep 2 --exit 0`. The demo and the end-to-end
tests use it to prove that each rank saw its own GPUs and the torchrun variables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

CONTRACT = (
    "RALLY_JOB_ID",
    "RALLY_ATTEMPT",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    # a fractional job's share (``jobs.launch.share_env``)
    "RALLY_GPU_MILLI",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankprobe")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0, dest="exit_code")
    args = parser.parse_args(argv)
    seen = {k: os.environ.get(k) for k in CONTRACT}
    seen["started"] = str(time.time())
    out = Path(args.out) / f"{seen['RALLY_JOB_ID']}-rank{seen['RANK']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(seen))
    tmp.replace(out)
    time.sleep(args.sleep)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
