"""MIG instances on a real GPU through NVML: the slice the scheduler gave a rank, made if it is not there.

The scheduler's ``carve`` (``core.mig``) picks a profile and a start memory slice on a GPU in MIG mode so
that no busy instance is touched. Here the agent makes that slice real before the rank starts
(``NvmlGpus.mig_device``), and answers the MIG device's UUID for the rank's ``CUDA_VISIBLE_DEVICES``:

1. the GPU instance profile is the one whose compute slices and memory (rounded up to whole GB, as
   ``nvidia-smi mig -lgip`` names them) match the name (``3g.40gb``); media-extension variants are not used;
2. a GPU instance of that profile already at that start is reused (its compute instance too);
3. else every instance overlapping the slices is destroyed first, but only one no process runs on (an
   instance with a process on it means the layout is not what the log says: the launch fails with the
   reason, the running work is never touched), and the instance is created at that placement (the start
   must be one NVML lists for the profile), with one compute instance spanning it.

Each failure raises ``MigUnavailable`` with NVML's reason (creating instances needs root, or
``CAP_SYS_ADMIN`` with the MIG capability devices). Instances are left in place when their ranks end: the
next rank of the same profile there reuses them, and a different layout replaces the idle ones.
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Iterator
from typing import Any

from rallypoint.agent.backend import MigUnavailable

__all__ = ["make_mig_device"]

_NAME = re.compile(r"^(\d)g\.(\d+)gb$")
# The GPU instance profiles a plain ``Ng.Mgb`` name may be (nvml.h's NVML_GPU_INSTANCE_PROFILE_*, by name,
# as older nvidia-ml-py lacks some); the ``+me``/``-me`` media variants are left out (docs/sharing.md).
_GI_PROFILES = (
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
)


def make_mig_device(nvml: Any, handle: Any, profile: str, start: int) -> str:
    """The UUID of the MIG device of ``profile`` at memory slice ``start`` of the GPU ``handle``, made as
    the module says; ``MigUnavailable`` when it cannot be."""
    try:
        info = _profile_info(nvml, handle, profile)
        instance = _instance_at(nvml, handle, info, start)
        if instance is None:
            size = _placement_size(nvml, handle, info.id, start)
            _clear(nvml, handle, start, size)
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, size
            instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(placement))
        _ensure_compute_instance(nvml, instance, info.sliceCount)
        return _uuid_of(nvml, handle, instance)
    except nvml.NVMLError as exc:
        raise MigUnavailable(f"NVML could not make {profile} at slice {start}: {exc}") from exc


def _profiles(nvml: Any, handle: Any) -> Iterator[Any]:
    """The profile infos of the GPU instance profiles this GPU has, among those this backend knows."""
    seen: set[int] = set()
    for name in _GI_PROFILES:
        constant = getattr(nvml, name, None)
        if constant is None:
            continue
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        except nvml.NVMLError:
            continue  # not a profile of this GPU
        if info.id not in seen:
            seen.add(info.id)
            yield info


def _profile_info(nvml: Any, handle: Any, profile: str) -> Any:
    match = _NAME.match(profile)
    if match is None:
        raise MigUnavailable(f"{profile!r} is not a MIG profile name this backend makes (Ng.Mgb)")
    slices, gigabytes = int(match.group(1)), int(match.group(2))
    for info in _profiles(nvml, handle):
        if info.sliceCount == slices and math.ceil(info.memorySizeMB / 1024) == gigabytes:
            return info
    raise MigUnavailable(f"this GPU has no MIG profile {profile}")


def _instances(nvml: Any, handle: Any, info: Any) -> list[Any]:
    """The GPU instances of one profile (``info``: its profile info) on the GPU."""
    found = (nvml.c_nvmlGpuInstance_t * max(1, info.instanceCount))()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(handle, info.id, found, ctypes.byref(count))
    return [found[i] for i in range(count.value)]


def _all_instances(nvml: Any, handle: Any) -> Iterator[tuple[Any, Any]]:
    """Every GPU instance of the profiles this backend knows, with its info."""
    for info in _profiles(nvml, handle):
        for instance in _instances(nvml, handle, info):
            yield instance, nvml.nvmlGpuInstanceGetInfo(instance)


def _instance_at(nvml: Any, handle: Any, info: Any, start: int) -> Any | None:
    for instance in _instances(nvml, handle, info):
        if nvml.nvmlGpuInstanceGetInfo(instance).placement.start == start:
            return instance
    return None


def _placement_size(nvml: Any, handle: Any, profile_id: int, start: int) -> int:
    """The memory slices an instance of the profile takes at ``start`` (NVML's possible placements)."""
    capacity = 8
    placements = (nvml.c_nvmlGpuInstancePlacement_t * capacity)()
    count = ctypes.c_uint(capacity)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, ctypes.byref(count))
    for i in range(count.value):
        if placements[i].start == start:
            return int(placements[i].size)
    raise MigUnavailable(f"NVML does not place this profile at memory slice {start}")


def _clear(nvml: Any, handle: Any, start: int, size: int) -> None:
    """Destroy the instances overlapping slices [start, start + size), all of them idle, or none."""
    overlapping = [
        (instance, info)
        for instance, info in _all_instances(nvml, handle)
        if info.placement.start < start + size and start < info.placement.start + info.placement.size
    ]
    for _, info in overlapping:
        if _busy(nvml, handle, info.id):
            raise MigUnavailable(
                f"GPU instance {info.id} at slice {info.placement.start} has a process running on it"
            )
    for instance, _ in overlapping:
        for compute in _compute_instances(nvml, instance):
            nvml.nvmlComputeInstanceDestroy(compute)
        nvml.nvmlGpuInstanceDestroy(instance)


def _compute_instances(nvml: Any, instance: Any) -> list[Any]:
    found: list[Any] = []
    for slices in (1, 2, 3, 4, 7):
        constant = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
        if constant is None:
            continue
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                instance, constant, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except nvml.NVMLError:
            continue
        room = (nvml.c_nvmlComputeInstance_t * max(1, info.instanceCount))()
        count = ctypes.c_uint(0)
        nvml.nvmlGpuInstanceGetComputeInstances(instance, info.id, room, ctypes.byref(count))
        found.extend(room[i] for i in range(count.value))
    return found


def _ensure_compute_instance(nvml: Any, instance: Any, slices: int) -> None:
    """One compute instance spanning the GPU instance, unless it has one."""
    if _compute_instances(nvml, instance):
        return
    constant = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE")
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        instance, constant, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    nvml.nvmlGpuInstanceCreateComputeInstance(instance, info.id)


def _mig_handles(nvml: Any, handle: Any) -> Iterator[Any]:
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError:
            continue  # no MIG device at this index


def _device_of(nvml: Any, handle: Any, gpu_instance_id: int) -> Any | None:
    """The MIG device (what CUDA sees) of a GPU instance, once it has a compute instance."""
    for mig in _mig_handles(nvml, handle):
        if nvml.nvmlDeviceGetGpuInstanceId(mig) == gpu_instance_id:
            return mig
    return None


def _busy(nvml: Any, handle: Any, gpu_instance_id: int) -> bool:
    mig = _device_of(nvml, handle, gpu_instance_id)
    return mig is not None and bool(nvml.nvmlDeviceGetComputeRunningProcesses(mig))


def _uuid_of(nvml: Any, handle: Any, instance: Any) -> str:
    gpu_instance_id = nvml.nvmlGpuInstanceGetInfo(instance).id
    mig = _device_of(nvml, handle, gpu_instance_id)
    if mig is None:
        raise MigUnavailable(f"GPU instance {gpu_instance_id} has no MIG device after its compute instance")
    uuid = nvml.nvmlDeviceGetUUID(mig)
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
