"""The golden Philly slice (VC 11cb48, week of 2017-10-09) and its per-job FIFO results from two peers."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from rallypoint.sim.cluster import Cluster, homogeneous
from rallypoint.sim.workload import Job

from .philly import read_rows, select, to_jobs

GOLDEN_INPUT = "golden/philly_11cb48_2017-10-09.csv"
GOLDEN_PERJOB = "golden/philly_11cb48_2017-10-09_fifo_{gpus}gpu_perjob.csv"


@dataclass(frozen=True, slots=True)
class GoldenRow:
    row: int
    num_gpus: int
    duration: int
    submit: int
    start: int
    end: int


def default_traces_dir(repo_root: Path) -> Path:
    """The shared traces sit beside the checkout: ``<parent of repo>/shared/traces``."""
    return repo_root.resolve().parent / "shared" / "traces"


def golden_jobs(traces_dir: Path) -> list[Job]:
    """The golden input as canonical jobs: t = 0 at the first submit, whole seconds, ids = row numbers."""
    return to_jobs(select(read_rows(traces_dir / GOLDEN_INPUT)))


def golden_cluster(gpus: int) -> Cluster:
    """One rack of 8-GPU nodes (64 GPUs = 8 nodes, 32 GPUs = 4 nodes)."""
    return homogeneous(racks=1, nodes_per_rack=gpus // 8, gpus_per_node=8)


def golden_rows(traces_dir: Path, gpus: int) -> list[GoldenRow]:
    path = traces_dir / GOLDEN_PERJOB.format(gpus=gpus)
    with path.open(newline="") as f:
        return [
            GoldenRow(
                int(r["row"]),
                int(r["num_gpus"]),
                int(r["duration_s"]),
                int(r["submit_s"]),
                int(r["start_s"]),
                int(r["end_s"]),
            )
            for r in csv.DictReader(f)
        ]
