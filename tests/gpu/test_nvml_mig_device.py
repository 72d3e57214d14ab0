"""MIG instances made through NVML on a real GPU in MIG mode (``agent.nvml_mig``). Skipped without an
NVIDIA GPU in MIG mode (``nvidia-smi -i N -mig 1``) or without the root that creating instances needs."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

from rallypoint.agent import NvmlGpus, NvmlUnavailable, nvml_mig
from rallypoint.agent.backend import MigUnavailable

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mig_gpu() -> Iterator[tuple[NvmlGpus, int]]:
    try:
        backend = NvmlGpus()
    except NvmlUnavailable:
        pytest.skip("needs an NVIDIA GPU and driver (NVML)")
    try:
        index = next((d.index for d in backend.inventory() if d.mig), None)
        if index is None:
            pytest.skip("needs a GPU in MIG mode (nvidia-smi -i N -mig 1)")
        if os.geteuid() != 0:
            pytest.skip("creating MIG instances needs root")
        yield backend, index
    finally:
        backend.close()


def test_the_smallest_slice_is_made_at_the_last_start_reused_and_released(
    mig_gpu: tuple[NvmlGpus, int],
) -> None:
    gpus, index = mig_gpu
    nv = gpus._nvml
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    profile = f"1g.{math.ceil(info.memorySizeMB / 1024)}gb"
    start = max(s for s in range(8) if _placeable(nv, handle, info.id, s))
    uuid = gpus.mig_device(index, profile, start)
    try:
        assert uuid.startswith("MIG-")
        assert gpus.mig_device(index, profile, start) == uuid  # the same instance, reused
    finally:
        nvml_mig._clear(nv, handle, start, 1)  # idle: destroyed, the GPU left as it was


def _placeable(nv: Any, handle: Any, profile_id: int, start: int) -> bool:
    try:
        nvml_mig._placement_size(nv, handle, profile_id, start)
    except (MigUnavailable, nv.NVMLError):
        return False
    return True
