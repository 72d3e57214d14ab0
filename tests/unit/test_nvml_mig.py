"""MIG instances made through NVML (``agent.nvml_mig``) against a fake NVML library that keeps an H100's
MIG geometry: its GPU instance profiles, their placements, GPU and compute instances, the MIG devices they
show as, and processes on them. The real path needs root on a MIG-mode GPU (``tests/gpu``); this checks
what the agent asks NVML for: reuse, creation at the scheduler's slice, idle overlapping instances
replaced, busy ones never touched."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from test_gpu_backends import _FakeNvml

from rallypoint.agent import NvmlGpus
from rallypoint.agent.backend import MigUnavailable

# profile constant -> (profile id, compute slices, memory MB, most instances, placements as (start, size))
_H100 = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 9856, 7, [(s, 1) for s in range(7)]),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (15, 1, 19968, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 19968, 3, [(0, 2), (2, 2), (4, 2)]),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 40192, 2, [(0, 4), (4, 4)]),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 40192, 1, [(0, 4)]),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 81408, 1, [(0, 8)]),
}
MIG_GPU = 3


class _FakeMigNvml(_FakeNvml):
    """``_FakeNvml`` whose GPU 3 (in MIG mode) has an H100's MIG profiles and keeps its instances."""

    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED

    def __init__(self) -> None:
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_COMPUTE_INSTANCE_PROFILE_")):
                setattr(self, name, getattr(pynvml, name))
        self.instances: dict[int, tuple[int, int, int]] = {}  # GPU instance id -> (profile id, start, size)
        self.computes: dict[int, int] = {}  # compute instance id -> its GPU instance id
        self.busy: set[int] = set()  # GPU instances with a process on them
        self.calls: list[str] = []
        self._next_gi, self._next_ci = 1, 101

    def _profile(self, h: int, constant: int) -> tuple[int, int, int, int, list[tuple[int, int]]]:
        if h != MIG_GPU or constant not in _H100:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _H100[constant]

    def _by_id(self, profile_id: int) -> tuple[int, int, int, int, list[tuple[int, int]]]:
        return next(p for p in _H100.values() if p[0] == profile_id)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: int, constant: int) -> Any:
        pid, slices, memory, most, _ = self._profile(h, constant)
        return self._ns(id=pid, sliceCount=slices, memorySizeMB=memory, instanceCount=most)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: int, pid: int, out: Any, count: Any) -> int:
        placements = self._by_id(pid)[4]
        for i, (start, size) in enumerate(placements):
            out[i].start, out[i].size = start, size
        count._obj.value = len(placements)
        return 0

    def nvmlDeviceGetGpuInstances(self, h: int, pid: int, out: Any, count: Any) -> int:
        mine = sorted(gi for gi, (p, _, _) in self.instances.items() if p == pid)
        for i, gi in enumerate(mine):
            out[i] = gi
        count._obj.value = len(mine)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: int, pid: int, placement: Any) -> int:
        start, size = placement._obj.start, placement._obj.size
        if any(s < start + size and start < s + n for _, s, n in self.instances.values()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi, self._next_gi = self._next_gi, self._next_gi + 1
        self.instances[gi] = (pid, start, size)
        self.calls.append(f"create gi {gi} at {start}")
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        pid, start, size = self.instances[gi]
        return self._ns(id=gi, profileId=pid, placement=self._ns(start=start, size=size))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, constant: int, engine: int) -> Any:
        return self._ns(id=constant, instanceCount=1)

    def nvmlGpuInstanceGetComputeInstances(self, gi: int, ci_pid: int, out: Any, count: Any) -> int:
        mine = sorted(ci for ci, owner in self.computes.items() if owner == gi)
        slices = self._by_id(self.instances[gi][0])[1]
        if ci_pid != getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE"):
            mine = []
        for i, ci in enumerate(mine):
            out[i] = ci
        count._obj.value = len(mine)
        return 0

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_pid: int) -> int:
        ci, self._next_ci = self._next_ci, self._next_ci + 1
        self.computes[ci] = gi
        return ci

    def nvmlComputeInstanceDestroy(self, ci: int) -> int:
        del self.computes[ci]
        return 0

    def nvmlGpuInstanceDestroy(self, gi: int) -> int:
        assert gi not in self.busy and gi not in self.computes.values()
        del self.instances[gi]
        self.calls.append(f"destroy gi {gi}")
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def _devices(self) -> list[int]:
        return sorted(set(self.computes.values()))  # a GPU instance with a compute instance

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, index: int) -> tuple[str, int]:
        devices = self._devices()
        if index >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", devices[index])

    def nvmlDeviceGetGpuInstanceId(self, mig: tuple[str, int]) -> int:
        return mig[1]

    def nvmlDeviceGetComputeRunningProcesses(self, mig: tuple[str, int]) -> list[Any]:
        return [self._ns(pid=4242)] if mig[1] in self.busy else []

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"MIG-fake-{h[1]}" if isinstance(h, tuple) else super().nvmlDeviceGetUUID(h)


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _FakeMigNvml:
    nvml = _FakeMigNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_a_slice_is_made_at_the_schedulers_start_and_reused_after(fake: _FakeMigNvml, tmp_path: Path) -> None:
    with NvmlGpus(sysfs_root=tmp_path) as gpus:
        first = gpus.mig_device(MIG_GPU, "1g.10gb", 6)
        assert first.startswith("MIG-") and fake.calls == ["create gi 1 at 6"]
        assert list(fake.computes.values()) == [1]  # one compute instance spanning it
        assert gpus.mig_device(MIG_GPU, "1g.10gb", 6) == first and len(fake.calls) == 1  # reused
        # another profile elsewhere, by its memory as nvidia-smi names it (40192 MB: 40gb)
        assert gpus.mig_device(MIG_GPU, "3g.40gb", 0) != first
        assert sorted(start for _, start, _ in fake.instances.values()) == [0, 6]


def test_idle_overlapping_instances_are_replaced_and_busy_ones_never_touched(
    fake: _FakeMigNvml, tmp_path: Path
) -> None:
    with NvmlGpus(sysfs_root=tmp_path) as gpus:
        gpus.mig_device(MIG_GPU, "1g.10gb", 0)
        gpus.mig_device(MIG_GPU, "2g.20gb", 2)
        fake.busy.add(2)  # a process runs on the 2g
        with pytest.raises(MigUnavailable, match="has a process running on it"):
            gpus.mig_device(MIG_GPU, "4g.40gb", 0)  # would take both
        assert set(fake.instances) == {1, 2}  # nothing destroyed, not even the idle 1g
        fake.busy.clear()
        made = gpus.mig_device(MIG_GPU, "4g.40gb", 0)
        assert fake.calls[-3:] == ["destroy gi 1", "destroy gi 2", "create gi 3 at 0"]
        assert made == "MIG-fake-3" and not set(fake.computes.values()) - {3}


def test_what_nvml_cannot_make_is_refused_with_the_reason(fake: _FakeMigNvml, tmp_path: Path) -> None:
    with NvmlGpus(sysfs_root=tmp_path) as gpus:
        with pytest.raises(MigUnavailable, match="not in MIG mode"):
            gpus.mig_device(0, "1g.10gb", 0)
        with pytest.raises(MigUnavailable, match=r"no MIG profile 5g\.50gb"):
            gpus.mig_device(MIG_GPU, "5g.50gb", 0)
        with pytest.raises(MigUnavailable, match="does not place this profile at memory slice 1"):
            gpus.mig_device(MIG_GPU, "3g.40gb", 1)
        with pytest.raises(MigUnavailable, match="not a MIG profile name"):
            gpus.mig_device(MIG_GPU, "1g.10gb+me", 0)
        assert fake.instances == {}
