"""Conversions from the public traces to the canonical (workload, cluster, queues) triple.

Used by ``rally trace convert`` and by the evaluation driver; nothing here knows about policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from rallypoint.scheduling.queues import Cohort, Queues, Team, queues_to_obj
from rallypoint.sim.cluster import Cluster, ClusterFile, Faults, Generator, build_cluster, cluster_to_obj
from rallypoint.sim.workload import Job, write_workload

from . import load, openb, philly

LoadMode = Literal["scale-cluster", "compress"]

DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("training-high", 0.1),
    ("training-standard", 0.6),
    ("best-effort", 0.3),
)


def repo_root() -> Path:
    """The checkout this package was imported from (libs/rallypoint/traces -> repo)."""
    return Path(__file__).resolve().parents[3]


def default_traces_dir() -> Path:
    return repo_root().parent / "shared" / "traces"


@dataclass
class Converted:
    jobs: list[Job]
    cluster: Cluster
    queues: Queues | None
    info: dict[str, Any] = field(default_factory=dict)
    cluster_obj: dict[str, Any] | None = None  # compact (generator) form to write, when there is one

    def write(self, out_dir: Path) -> dict[str, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {"workload": out_dir / "workload.jsonl", "cluster": out_dir / "cluster.yaml"}
        write_workload(paths["workload"], self.jobs)
        obj = self.cluster_obj if self.cluster_obj is not None else cluster_to_obj(self.cluster)
        paths["cluster"].write_text(yaml.safe_dump(obj, sort_keys=False))
        if self.queues is not None:
            paths["queues"] = out_dir / "queues.yaml"
            paths["queues"].write_text(yaml.safe_dump(queues_to_obj(self.queues), sort_keys=False))
        (out_dir / "info.yaml").write_text(yaml.safe_dump(self.info, sort_keys=False))
        return paths


def homogeneous_cluster(
    gpus: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 8,
    gpu_type: str = "gpu",
    faults: Faults | None = None,
) -> tuple[Cluster, dict[str, Any]]:
    """Whole racks plus one partial rack; returns the cluster and its compact generator form."""
    nodes = gpus // gpus_per_node
    full, rest = divmod(nodes, nodes_per_rack)
    gens: list[Generator] = []
    if full:
        gens.append(
            Generator(
                racks=full, nodes_per_rack=nodes_per_rack, gpus_per_node=gpus_per_node, gpu_type=gpu_type
            )
        )
    if rest:
        gens.append(
            Generator(
                racks=1, nodes_per_rack=rest, gpus_per_node=gpus_per_node, gpu_type=gpu_type, prefix="p"
            )
        )
    spec = ClusterFile(generator=gens, faults=faults or Faults())
    obj: dict[str, Any] = msgspec.to_builtins(spec)
    obj.pop("nodes", None)
    obj.pop("name", None)
    if spec.faults == Faults():
        obj.pop("faults", None)
    return build_cluster(spec), obj


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``training-high=0.1,training-standard=0.6,best-effort=0.3``"""
    out = []
    for part in text.split(","):
        name, _, w = part.partition("=")
        if not name or not w:
            raise ValueError(f"bad priority mix entry {part!r} (want class=weight)")
        out.append((name.strip(), float(w)))
    return tuple(out)


def _finish_jobs(
    jobs: list[Job],
    mix: Sequence[tuple[str, float]] | None,
    seed: int,
    time_limits: str,
    checkpoint_interval: float | None,
) -> list[Job]:
    if mix:
        jobs = philly.assign_priorities(jobs, mix, seed)
    out = []
    for j in jobs:
        tl = {"none": None, "exact": j.duration, "ladder": philly.time_limit_ladder(j.duration)}[time_limits]
        out.append(msgspec.structs.replace(j, time_limit=tl, checkpoint_interval=checkpoint_interval))
    return out


def convert_philly(
    jobs_csv: Path,
    vc_csv: Path | None,
    start: datetime,
    days: float,
    vcs: Sequence[str] | None = None,
    target_load: float | None = None,
    mode: LoadMode = "scale-cluster",
    gpus: int | None = None,
    nodes_per_rack: int = 8,
    mix: Sequence[tuple[str, float]] | None = DEFAULT_MIX,
    seed: int = 0,
    time_limits: str = "ladder",
    checkpoint_interval: float | None = 1800.0,
    faults: Faults | None = None,
) -> Converted:
    """A Philly window; t = 0 is the window start. Quotas per VC in proportion to its size."""
    end = start + timedelta(days=days)
    rows = philly.select(philly.read_rows(jobs_csv), start, end, vcs)
    if not rows:
        raise ValueError(f"no Philly jobs in [{start}, {end})")
    jobs = philly.to_jobs(rows, origin=start)
    window = days * 86400.0
    sizes = philly.read_vc_sizes(vc_csv) if vc_csv else {}
    teams = sorted({j.team for j in jobs})
    real_gpus = 8 * sum(sizes.get(t, 0) for t in teams) or 8 * math.ceil(max(j.gpus for j in jobs) / 8)
    info: dict[str, Any] = {
        "source": str(jobs_csv),
        "start": str(start),
        "days": days,
        "jobs": len(jobs),
        "gpu_hours": load.work(jobs) / 3600,
        "real_gpus": real_gpus,
        "load_at_real_size": load.offered_load(jobs, real_gpus, window),
    }
    if target_load is None:
        n_gpus = gpus or real_gpus
    elif mode == "scale-cluster":
        n_gpus = load.gpus_for_load(jobs, window, target_load)
    else:
        n_gpus = gpus or real_gpus
        jobs, window = load.compress_arrivals(jobs, n_gpus, window, target_load)
    cluster, gen = homogeneous_cluster(n_gpus, nodes_per_rack=nodes_per_rack, faults=faults)
    jobs = _finish_jobs(jobs, mix, seed, time_limits, checkpoint_interval)
    # Quotas: each VC's nominal is its share of the simulated cluster, in proportion to its real size
    # (VCs without a known size get an equal share of one node's worth, so they are not starved by config).
    weights = {t: float(sizes.get(t, 1)) for t in teams}
    nominal = load.split_quota(n_gpus, weights)
    queues = Queues(
        teams=[Team(name=t, nominal=nominal[t], cohort="philly", weight=weights[t]) for t in teams],
        cohorts=[Cohort(name="philly")],
    )
    info.update(
        {
            "gpus": n_gpus,
            "window_s": window,
            "offered_load": load.offered_load(jobs, n_gpus, window),
            "mode": mode if target_load is not None else "none",
        }
    )
    return Converted(jobs, cluster, queues, info, cluster_obj=gen)


def convert_openb(
    nodes_csv: Path,
    pods_csv: Path,
    target_load: float | None = None,
    nodes_per_rack: int = 16,
    checkpoint_interval: float | None = None,
    shares: bool = False,
) -> Converted:
    """The openb cluster as is; its whole-GPU pods (``shares``: its fractional pods too, and every pod's CPU
    and memory), optionally with arrivals compressed to a load."""
    cluster = openb.read_nodes(nodes_csv, nodes_per_rack=nodes_per_rack)
    jobs, skipped = openb.read_pods(pods_csv, shares=shares)
    if not jobs:
        raise ValueError(f"{pods_csv}: no whole-GPU pods")
    t0 = jobs[0].submit
    jobs = [
        msgspec.structs.replace(j, submit=j.submit - t0, checkpoint_interval=checkpoint_interval)
        for j in jobs
    ]
    window = max(j.submit for j in jobs) + 1.0
    info: dict[str, Any] = {
        "source": str(pods_csv),
        "nodes": len(cluster.nodes),
        "gpus": cluster.total_gpus,
        "jobs": len(jobs),
        "skipped": {
            "fractional": skipped.fractional,
            "cpu_only": skipped.cpu_only,
            "never_ran": skipped.never_ran,
        },
        "typed_jobs": sum(j.gpu_type is not None for j in jobs),
        "fractional_jobs": sum(j.gpu_milli is not None for j in jobs),
    }
    if target_load is not None:
        jobs, window = load.compress_arrivals(jobs, cluster.total_gpus, window, target_load)
    info["window_s"] = window
    info["offered_load"] = load.offered_load(jobs, cluster.total_gpus, window)
    jobs = [msgspec.structs.replace(j, time_limit=philly.time_limit_ladder(j.duration)) for j in jobs]
    return Converted(jobs, cluster, None, info)
