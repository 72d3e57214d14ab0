"""GPU backends without a GPU: the simulated set (inventory, domains, faults) and NVML's failure mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from rallypoint.agent import GpuBackend, NvmlGpus, NvmlUnavailable, SimulatedGpus, gpu_infos, parse_fault_spec
from rallypoint.agent.backend import MigUnavailable
from rallypoint.agent.nvml_backend import normalize_bus_id, nvlink_domains
from rallypoint.agent.sim_backend import FAULTS_ENV, sim_uuid
from rallypoint.protocol import NicSample


def test_simulated_inventory_is_deterministic_and_node_specific() -> None:
    a = SimulatedGpus("node-1", 8, memory_mib=40960)
    b = SimulatedGpus("node-1", 8, memory_mib=40960)
    c = SimulatedGpus("node-2", 8)
    assert isinstance(a, GpuBackend)
    assert a.inventory() == b.inventory()
    assert [d.index for d in a.inventory()] == list(range(8))
    assert all(d.memory_mib == 40960 and d.name == "sim-h100" for d in a.inventory())
    uuids = [d.uuid for d in a.inventory()]
    assert len(set(uuids)) == 8 and all(u.startswith("GPU-") for u in uuids)
    assert uuids[3] == sim_uuid("node-1", 3)
    assert not set(uuids) & {d.uuid for d in c.inventory()}
    infos = gpu_infos(a)
    assert [(i.index, i.uuid, i.nvlink_domain) for i in infos] == [
        (d.index, d.uuid, 0) for d in a.inventory()
    ]


@pytest.mark.parametrize(
    ("count", "size", "expected"),
    [
        (8, 8, [0] * 8),
        (8, 4, [0, 0, 0, 0, 1, 1, 1, 1]),
        (8, 2, [0, 0, 1, 1, 2, 2, 3, 3]),
        (6, 4, [0, 0, 0, 0, 1, 1]),
        (4, 1, [0, 1, 2, 3]),
    ],
)
def test_simulated_nvlink_domains(count: int, size: int, expected: list[int]) -> None:
    gpus = SimulatedGpus("n", count, nvlink_domain_size=size)
    assert [d.nvlink_domain for d in gpus.inventory()] == expected


def test_simulated_samples_are_seeded_not_clocked() -> None:
    first = [SimulatedGpus("n", 4, seed=7).sample() for _ in range(2)]
    again = SimulatedGpus("n", 4, seed=7)
    assert again.sample() == first[0]
    other_seed = SimulatedGpus("n", 4, seed=8).sample()
    assert other_seed != first[0]
    healthy = first[0]
    assert all(30 < s.temperature_c < 40 and s.utilization == 0 and s.memory_used_mib == 0 for s in healthy)
    assert all(s.ecc_uncorrectable == 0 and s.xid == 0 and not s.throttled for s in healthy)


def test_busy_gpus_look_busy() -> None:
    gpus = SimulatedGpus("n", 4)
    gpus.set_busy([1, 2], True)
    samples = gpus.sample()
    assert [s.utilization > 80 for s in samples] == [False, True, True, False]
    assert samples[1].memory_used_mib > 0 and samples[0].memory_used_mib == 0


def test_fault_injection_methods() -> None:
    gpus = SimulatedGpus("n", 4)
    gpus.inject_thermal(0, 97.0)
    gpus.inject_ecc(1)
    gpus.inject_ecc(1, 2)
    gpus.inject_xid(2, 48)
    gpus.inject_throttle(3)
    s = gpus.sample()
    assert s[0].temperature_c == 97.0 and s[0].throttled  # that hot, the GPU slows itself down
    assert s[1].ecc_uncorrectable == 3 and not s[1].throttled
    assert s[2].xid == 48
    assert s[3].throttled and s[3].temperature_c < 40
    gpus.clear_faults(1)
    assert gpus.sample()[1].ecc_uncorrectable == 0
    gpus.clear_faults()
    assert all(x.xid == 0 and not x.throttled for x in gpus.sample())
    with pytest.raises(IndexError):
        gpus.inject_xid(4)


def test_faults_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULTS_ENV, "1:xid=79; *:ecc=2")
    s = SimulatedGpus("n", 2).sample()
    assert [x.xid for x in s] == [0, 79]
    assert [x.ecc_uncorrectable for x in s] == [2, 2]


def test_faults_from_file_follow_its_contents(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    gpus = SimulatedGpus("n", 8, fault_file=faults)
    assert all(x.xid == 0 for x in gpus.sample())  # absent file: no faults
    faults.write_text("# demo\n3:xid=79\n5:thermal\n12:ecc\n")  # 12: not on this node, ignored
    s = gpus.sample()
    assert s[3].xid == 79 and s[5].temperature_c == 95.0
    faults.write_text("not a fault")  # malformed: keep what we had
    assert gpus.sample()[3].xid == 79
    faults.write_text("")
    s = gpus.sample()
    assert s[3].xid == 0 and s[5].temperature_c < 40


def test_parse_fault_spec_errors() -> None:
    assert [(f.index, f.kind, f.value) for f in parse_fault_spec("*:throttle, 2:thermal=88.5")] == [
        (None, "throttle", 1.0),
        (2, "thermal", 88.5),
    ]
    for bad in ("3", "x:xid", "1:melt", "1:xid=abc", "-1:xid"):
        with pytest.raises(ValueError):
            parse_fault_spec(bad)


def test_nvml_without_driver_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Independent of the machine: make nvmlInit fail the way it does where no driver is installed.
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(NvmlUnavailable, match="NVIDIA GPU with its driver"):
        NvmlGpus()


def test_nvml_domain_rule() -> None:
    # HGX board: every GPU on the NVSwitch fabric -> one domain.
    assert nvlink_domains(8, {}, set(range(8))) == [0] * 8
    # Two NVLink-bridged pairs and two lone PCIe cards.
    assert nvlink_domains(6, {0: {1}, 2: {3}}, set()) == [0, 0, 1, 1, 2, 3]
    # DGX-1 style mesh: links within each quad, no switch.
    links = {0: {1, 2, 3}, 1: {2}, 4: {5, 6, 7}, 6: {7}}
    assert nvlink_domains(8, links, set()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert normalize_bus_id("00000000:3B:00.0") == normalize_bus_id(b"0000:3b:00.0")


class _FakeNvml:
    """Just enough of pynvml to run NvmlGpus without a GPU: 4 GPUs, 0-1 on an NVSwitch, 2-3 bridged.

    Real-pynvml constants and error class, so the backend's error handling is what is exercised.
    """

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self) -> None:
        self.shutdowns = 0
        self.pending_xids: list[tuple[int, int]] = [(2, 79)]
        self.nvlink_reads: list[tuple[int, int, int]] = []
        self.bus = [f"00000000:{0x10 + i:02X}:00.0" for i in range(4)]
        # gpu -> links: ("switch", bus) or ("gpu", index)
        self.links: dict[int, list[tuple[str, Any]]] = {
            0: [("switch", "0000:a0:00.0")],
            1: [("switch", "0000:a1:00.0")],
            2: [("gpu", 3)],
            3: [("gpu", 2)],
        }

    @staticmethod
    def _ns(**kw: object) -> Any:
        return type("NS", (), kw)()

    def _unsupported(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA Fake 80GB"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        """GPU 3 runs MIG; GPU 2 has it pending (not current: still whole); 0-1 are not MIG-capable."""
        if h < 2:
            self._unsupported()
        return (pynvml.NVML_DEVICE_MIG_ENABLE, 1) if h == 3 else (pynvml.NVML_DEVICE_MIG_DISABLE, 1)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self._ns(total=80 * 1024**3, used=h * 1024**3)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return self._ns(busId=self.bus[h].encode())

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 40 + h

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return self._ns(gpu=10 * h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        # 0: SW power cap only (at TDP under load: normal); 1: HW thermal + the HW slowdown it engages;
        # 2: HW power brake; 3: idle.
        return [pynvml.nvmlClocksThrottleReasonSwPowerCap, 0x40 | 0x8, 0x80, 0x1][h]

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        if h == 3:
            self._unsupported()  # consumer card: no ECC
        assert counter == pynvml.NVML_VOLATILE_ECC
        if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return 100 + h
        return 2 if h == 0 else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        if h == 1:
            self._unsupported()  # counters not exposed (e.g. some vGPU setups): 0, not a crash
        if link >= len(self.links[h]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.nvlink_reads.append((h, link, counter))
        return (counter + 1) * (h + 1)  # replay, recovery, CRC flit, CRC data: 1, 2, 3, 4 (x GPU + 1)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= len(self.links[h]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        kind, target = self.links[h][link]
        return self._ns(busId=self.bus[target] if kind == "gpu" else target)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        if h == 1:
            self._unsupported()  # older driver: falls back to "remote is not a local GPU"
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH if self.links[h][link][0] == "switch" else 0

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlEventSetFree(self, events: str) -> None: ...
    def nvmlDeviceRegisterEvents(self, h: int, mask: int, events: str) -> None: ...

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.pending_xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        h, xid = self.pending_xids.pop(0)
        return self._ns(eventType=self.nvmlEventTypeXidCriticalError, eventData=xid, device=h)


def test_nvml_backend_against_a_fake_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "counters" / "symbol_error").write_text("5\n")
    with NvmlGpus(sysfs_root=tmp_path / "sys") as gpus:
        assert gpus.gpu_type == "NVIDIA Fake 80GB"
        assert [(d.uuid, d.memory_mib, d.nvlink_domain, d.mig) for d in gpus.inventory()] == [
            ("GPU-fake-0", 81920, 0, False),
            ("GPU-fake-1", 81920, 0, False),
            ("GPU-fake-2", 81920, 1, False),
            ("GPU-fake-3", 81920, 1, True),
        ]
        with pytest.raises(MigUnavailable, match="not in MIG mode"):  # its MIG mode is only pending
            gpus.mig_device(2, "1g.10gb", 0)
        s = gpus.sample()
        assert [x.temperature_c for x in s] == [40, 41, 42, 43]
        assert [x.utilization for x in s] == [0, 10, 20, 30]
        assert [x.memory_used_mib for x in s] == [0, 1024, 2048, 3072]
        assert [x.ecc_uncorrectable for x in s] == [2, 0, 0, 0]  # NotSupported on GPU 3 -> 0
        # Idle and SW power cap are not throttling; HW thermal (with its HW slowdown) and power brake are.
        assert [x.throttled for x in s] == [False, True, True, False]
        assert [x.throttle_thermal for x in s] == [False, True, False, False]
        assert [x.throttle_power_brake for x in s] == [False, False, True, False]
        assert [x.throttle_hw_slowdown for x in s] == [False, True, False, False]
        assert [x.ecc_corrected for x in s] == [100, 101, 102, 0]  # volatile counter; NotSupported -> 0
        # Summed over the enabled links' four counters; unreadable counters (GPU 1) count nothing.
        assert [x.nvlink_errors for x in s] == [10, 0, 30, 40]
        assert {(link, counter) for _, link, counter in fake.nvlink_reads} == {(0, c) for c in range(4)}
        assert gpus.nics() == (NicSample(name="mlx5_0/1", link_up=True, speed_gbps=200.0, errors=5),)
        assert gpus.slowdown() == 1.0
        assert [x.xid for x in s] == [0, 0, 79, 0]
        assert gpus.sample()[2].xid == 79  # the last XID sticks until the agent restarts
    assert fake.shutdowns == 1


def test_simulated_mig_gpus_register_as_such_and_give_stable_mig_devices() -> None:
    gpus = SimulatedGpus("n0", 4, mig_gpus=(2, 3))
    assert [info.mig for info in gpu_infos(gpus)] == [False, False, True, True]
    device = gpus.mig_device(2, "3g.40gb", 4)
    assert device.startswith("MIG-") and device == SimulatedGpus("n0", 4, mig_gpus=(2,)).mig_device(
        2, "3g.40gb", 4
    )
    assert len({device, gpus.mig_device(2, "3g.40gb", 0), gpus.mig_device(3, "3g.40gb", 4)}) == 3
    with pytest.raises(MigUnavailable, match="not in MIG mode"):
        gpus.mig_device(0, "1g.10gb", 0)
