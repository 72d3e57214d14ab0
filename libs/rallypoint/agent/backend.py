"""The GPU backend interface: what a node agent needs to know about its GPUs.

Two implementations: ``SimulatedGpus`` (every machine here, tests, demos, the simulator) and
``NvmlGpus`` (real NVIDIA GPUs through NVML). The agent depends only on this Protocol, so nothing
above it can tell the two apart, and a health-monitor test can drive faults through the simulated one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from rallypoint.events import GpuInfo
from rallypoint.protocol import GpuSample, NicSample

MIB = 1024 * 1024


class GpuDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU of the inventory. ``index`` is what CUDA_VISIBLE_DEVICES and placements use."""

    index: int
    uuid: str
    memory_mib: int
    nvlink_domain: int
    name: str
    mig: bool = False  # in MIG mode: it runs MIG slices only

    def to_info(self) -> GpuInfo:
        """The slice of the inventory that goes into ``NodeRegistered`` (the name travels as gpu_type)."""
        return GpuInfo(
            index=self.index,
            uuid=self.uuid,
            memory_mib=self.memory_mib,
            nvlink_domain=self.nvlink_domain,
            mig=self.mig,
        )


@runtime_checkable
class GpuBackend(Protocol):
    """A node's GPUs: a fixed inventory, and health samples on demand (and the node's NICs).

    ``sample()`` and ``nics()`` are called about once a second from the heartbeat loop; they must be cheap
    and must not raise for one misbehaving GPU or port (report what can be read, defaults for the rest).
    """

    @property
    def gpu_type(self) -> str:
        """The schedulable GPU type of this node (``sim-h100``, ``NVIDIA H100 80GB HBM3``...)."""
        ...

    def inventory(self) -> tuple[GpuDevice, ...]: ...

    def sample(self) -> tuple[GpuSample, ...]: ...

    def nics(self) -> tuple[NicSample, ...]:
        """The node's network ports (InfiniBand, Ethernet), sampled with the GPUs: same rules."""
        ...

    def slowdown(self) -> float:
        """How many times slower the agent should run this node's ranks: 1.0 except on a simulated
        node told to be slow (``node:slow=F``), which the agent makes real (``slowdown.DutyCycler``)."""
        ...

    def mig_device(self, index: int, profile: str, start: int) -> str:
        """The UUID of the MIG device of ``profile`` at memory slice ``start`` of GPU ``index``, made if it
        does not exist yet: what a MIG rank's ``CUDA_VISIBLE_DEVICES`` names. Raises ``MigUnavailable``
        when it cannot be made."""
        ...

    def close(self) -> None: ...


class MigUnavailable(RuntimeError):
    """A MIG slice the scheduler gave cannot be made on this node (the GPU is not in MIG mode, or the
    backend cannot create instances)."""


def gpu_infos(backend: GpuBackend) -> tuple[GpuInfo, ...]:
    return tuple(device.to_info() for device in backend.inventory())
