"""Node agent: GPU backends (simulated, NVML), the rank launcher, and the command protocol.

``NvmlGpus`` imports pynvml only when constructed, so importing this package never needs a GPU.
"""

from .backend import GpuBackend, GpuDevice, gpu_infos
from .launcher import LaunchOutcome, RankExit, RankLauncher
from .nvml_backend import NvmlGpus, NvmlUnavailable
from .sim_backend import FaultSpec, SimulatedGpus, parse_fault_spec
from .workdir import EXIT_LOST

__all__ = [
    "EXIT_LOST",
    "FaultSpec",
    "GpuBackend",
    "GpuDevice",
    "LaunchOutcome",
    "NvmlGpus",
    "NvmlUnavailable",
    "RankExit",
    "RankLauncher",
    "SimulatedGpus",
    "gpu_infos",
    "parse_fault_spec",
]
