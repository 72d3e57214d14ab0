"""Packing simulator: Alibaba openb replayed under FGD's protocol (ATC'23) with its six baselines."""

from rallypoint.sim.packing.fgd import FGDPolicy, Fragmentation
from rallypoint.sim.packing.protocol import Shape, arrivals, typical_pods
from rallypoint.sim.packing.result import summary
from rallypoint.sim.packing.runner import POLICIES, SeedRun, resolve, run_seed
from rallypoint.sim.packing.state import Cluster, Pod, State
from rallypoint.sim.packing.trace import NodeSpec, PodSpec, read_nodes, read_pods

__all__ = [
    "POLICIES",
    "Cluster",
    "FGDPolicy",
    "Fragmentation",
    "NodeSpec",
    "Pod",
    "PodSpec",
    "SeedRun",
    "Shape",
    "State",
    "arrivals",
    "read_nodes",
    "read_pods",
    "resolve",
    "run_seed",
    "summary",
    "typical_pods",
]
