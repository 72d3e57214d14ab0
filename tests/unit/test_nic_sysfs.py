"""nics.py, the real sysfs reader, on a sysfs-shaped tree the test builds (real files, real symlinks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rallypoint.agent.nics import read_nics
from rallypoint.protocol import NicSample


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def ib_port(
    root: Path, device: str, port: int, *, state: str, rate: str, symbol: int, rcv: int, downed: int
) -> Path:
    folder = root / "class" / "infiniband" / device / "ports" / str(port)
    write(folder / "state", state)
    write(folder / "phys_state", "5: LinkUp")
    write(folder / "rate", rate)
    write(folder / "counters" / "symbol_error", str(symbol))
    write(folder / "counters" / "port_rcv_errors", str(rcv))
    write(folder / "counters" / "link_downed", str(downed))
    return folder


def interface(
    root: Path,
    name: str,
    *,
    operstate: str = "up",
    speed: str = "25000",
    rx_errors: int = 0,
    physical: bool = True,
    if_type: str = "1",
    carrier_changes: int = 0,
) -> Path:
    """An interface as the kernel lays it out: the class entry is a symlink into /sys/devices."""
    parent = root / "devices" / ("pci0000:00/0000:00:03.0/net" if physical else "virtual/net")
    folder = parent / name
    write(folder / "operstate", operstate)
    write(folder / "speed", speed)
    write(folder / "type", if_type)
    write(folder / "carrier_changes", str(carrier_changes))
    write(folder / "statistics" / "rx_errors", str(rx_errors))
    if physical:
        (folder / "device").symlink_to(root / "devices" / "pci0000:00" / "0000:00:03.0")
    link = root / "class" / "net" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(folder, link.parent))
    return folder


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    ib_port(root, "mlx5_0", 1, state="4: ACTIVE", rate="400 Gb/sec (4X NDR)", symbol=3, rcv=4, downed=1)
    ib_port(root, "mlx5_1", 1, state="4: ACTIVE", rate="200 Gb/sec (4X HDR)", symbol=0, rcv=0, downed=0)
    ib_port(root, "mlx5_2", 1, state="1: DOWN", rate="10 Gb/sec (4X SDR)", symbol=0, rcv=9, downed=6)
    interface(root, "eth0", rx_errors=12, carrier_changes=4)
    interface(root, "eth1", operstate="down", speed="-1")
    interface(root, "lo", speed="0", physical=False, if_type="772")
    interface(root, "docker0", physical=False)
    interface(root, "ib0", if_type="32", speed="100000")  # IPoIB on mlx5_0: already reported as mlx5_0/1
    return root


def test_reads_infiniband_ports_and_physical_ethernet(sysfs: Path) -> None:
    assert read_nics(sysfs) == (
        NicSample(name="eth0", link_up=True, speed_gbps=25.0, errors=12, link_downed=2),
        NicSample(name="eth1", link_up=False, speed_gbps=0.0, errors=0),
        NicSample(name="mlx5_0/1", link_up=True, speed_gbps=400.0, errors=7, link_downed=1),
        NicSample(name="mlx5_1/1", link_up=True, speed_gbps=200.0, errors=0),
        NicSample(name="mlx5_2/1", link_up=False, speed_gbps=0.0, errors=9, link_downed=6),
    )


def test_counters_are_read_fresh_each_time(sysfs: Path) -> None:
    write(sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error", "103")
    write(sysfs / "class/infiniband/mlx5_0/ports/1/state", "1: DOWN")
    port = {n.name: n for n in read_nics(sysfs)}["mlx5_0/1"]
    assert (port.link_up, port.speed_gbps, port.errors) == (False, 0.0, 107)


def test_one_unreadable_or_malformed_file_costs_only_its_value(sysfs: Path) -> None:
    ib = sysfs / "class/infiniband/mlx5_0/ports/1"
    (ib / "counters" / "symbol_error").unlink()
    write(ib / "counters" / "port_rcv_errors", "garbage")
    write(ib / "rate", "unknown")
    (ib / "counters" / "link_downed").unlink()
    (ib / "counters" / "link_downed").mkdir()  # reading a folder fails (IsADirectoryError)
    eth0 = sysfs / "devices/pci0000:00/0000:00:03.0/net/eth0"
    (eth0 / "statistics" / "rx_errors").unlink()
    write(eth0 / "speed", "")
    nics = {n.name: n for n in read_nics(sysfs)}
    assert nics["mlx5_0/1"] == NicSample(name="mlx5_0/1", link_up=True, speed_gbps=0.0, errors=0)
    assert nics["eth0"] == NicSample(name="eth0", link_up=True, speed_gbps=0.0, errors=0, link_downed=2)
    assert set(nics) == {"eth0", "eth1", "mlx5_0/1", "mlx5_1/1", "mlx5_2/1"}


def test_a_host_without_network_classes_has_no_nics(tmp_path: Path) -> None:
    assert read_nics(tmp_path / "empty") == ()


def test_unknown_operstate_falls_back_to_the_carrier(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    folder = interface(root, "enp1s0", operstate="unknown", speed="100000")
    write(folder / "carrier", "1")
    assert read_nics(root)[0].link_up and read_nics(root)[0].speed_gbps == 100.0
    write(folder / "carrier", "0")
    assert not read_nics(root)[0].link_up


def test_the_real_sysfs_does_not_raise() -> None:
    """This host's own /sys: whatever it has, every sample is well formed (and lo is never one)."""
    nics = read_nics()
    assert all(n.name != "lo" and n.speed_gbps >= 0 and n.errors >= 0 for n in nics)
