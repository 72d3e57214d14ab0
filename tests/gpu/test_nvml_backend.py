"""The NVML backend on a real GPU. Skipped where NVML cannot start (no NVIDIA GPU or driver)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rallypoint.agent import GpuBackend, NvmlGpus, NvmlUnavailable, gpu_infos

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpus() -> Iterator[NvmlGpus]:
    try:
        backend = NvmlGpus()
    except NvmlUnavailable:
        pytest.skip("needs an NVIDIA GPU and driver (NVML)")
    try:
        yield backend
    finally:
        backend.close()


def test_inventory_is_real(gpus: NvmlGpus) -> None:
    assert isinstance(gpus, GpuBackend)
    devices = gpus.inventory()
    assert devices, "NVML started but reports no GPUs"
    assert [d.index for d in devices] == list(range(len(devices)))
    assert len({d.uuid for d in devices}) == len(devices)
    assert all(d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
    assert all(d.memory_mib > 1024 for d in devices)
    assert gpus.gpu_type == devices[0].name and gpus.gpu_type
    # Domains are numbered densely from 0 in order of first appearance (see nvml_backend's rule).
    domains = [d.nvlink_domain for d in devices]
    assert domains[0] == 0
    assert all(dom <= max(domains[:i], default=-1) + 1 for i, dom in enumerate(domains))
    assert [i.uuid for i in gpu_infos(gpus)] == [d.uuid for d in devices]


def test_samples_are_plausible(gpus: NvmlGpus) -> None:
    for _ in range(2):  # the second call also exercises draining the (empty) XID event set again
        samples = gpus.sample()
        assert [s.index for s in samples] == [d.index for d in gpus.inventory()]
        for sample, device in zip(samples, gpus.inventory(), strict=True):
            assert 0 < sample.temperature_c < 120
            assert 0 <= sample.utilization <= 100
            assert 0 <= sample.memory_used_mib <= device.memory_mib
            assert sample.ecc_uncorrectable >= 0 and sample.xid >= 0


def test_health_signals_are_consistent(gpus: NvmlGpus) -> None:
    """Throttle reasons, corrected ECC and NVLink counters as the detection reads them."""
    first = gpus.sample()
    second = gpus.sample()
    for before, after in zip(first, second, strict=True):
        reasons = (after.throttle_thermal, after.throttle_power_brake, after.throttle_hw_slowdown)
        assert after.throttled == any(reasons)
        # Volatile counters: since driver load, never negative, never dropping between two samples.
        assert 0 <= before.ecc_corrected <= after.ecc_corrected
        assert 0 <= before.nvlink_errors <= after.nvlink_errors
    assert gpus.slowdown() == 1.0


def test_nics_come_from_this_hosts_sysfs(gpus: NvmlGpus) -> None:
    nics = gpus.nics()
    assert [n.name for n in nics] == sorted(n.name for n in nics)
    assert all(n.name != "lo" and n.speed_gbps >= 0 and n.errors >= 0 and n.link_downed >= 0 for n in nics)
    assert all(n.speed_gbps == 0 for n in nics if not n.link_up)


def test_close_is_idempotent() -> None:
    try:
        backend = NvmlGpus()
    except NvmlUnavailable:
        pytest.skip("needs an NVIDIA GPU and driver (NVML)")
    backend.close()
    backend.close()
    with pytest.raises(RuntimeError):
        backend.sample()
