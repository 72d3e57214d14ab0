"""Node agent: GPU backends (simulated, NVML), the rank launcher, and the command protocol.

``NvmlGpus`` imports pynvml only when constructed, so importing this package never needs a GPU.

The names below are imported on first use (PEP 562), not with the package: the rank wrapper
(``rankwrap``, one process per rank) imports its two standard-library siblings through this package,
and importing the launcher and the backends with it (msgspec, the event catalogue) took ~75 ms of
every rank's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rallypoint.lazyexports import lazy_exports

if TYPE_CHECKING:
    from .backend import GpuBackend, GpuDevice, gpu_infos
    from .launcher import LaunchOutcome, RankExit, RankLauncher
    from .nvml_backend import NvmlGpus, NvmlUnavailable
    from .sim_backend import FaultSpec, SimulatedGpus, parse_fault_spec
    from .workdir import EXIT_LOST

#: Each public name -> the module of this package that defines it.
_HOMES = {
    "EXIT_LOST": ".workdir",
    "FaultSpec": ".sim_backend",
    "GpuBackend": ".backend",
    "GpuDevice": ".backend",
    "LaunchOutcome": ".launcher",
    "NvmlGpus": ".nvml_backend",
    "NvmlUnavailable": ".nvml_backend",
    "RankExit": ".launcher",
    "RankLauncher": ".launcher",
    "SimulatedGpus": ".sim_backend",
    "gpu_infos": ".backend",
    "parse_fault_spec": ".sim_backend",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
