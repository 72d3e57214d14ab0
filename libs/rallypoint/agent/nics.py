"""A node's network ports from sysfs: InfiniBand ports and physical Ethernet interfaces, as ``NicSample``s.

InfiniBand, one sample per port, named ``<device>/<port>`` (``mlx5_0/1``), from
``<root>/class/infiniband/<dev>/ports/<n>/``:

- ``state`` (``4: ACTIVE``): the link is up when the port is ACTIVE (INIT and ARMED carry no traffic);
- ``rate`` (``400 Gb/sec (4X NDR)``): the negotiated speed;
- ``counters/symbol_error`` + ``counters/port_rcv_errors``: the errors; ``counters/link_downed``: how
  often the link went down (a flap between two samples that sampling ``state`` would miss).

Ethernet, one sample per interface, from ``<root>/class/net/<if>/``: ``operstate`` (``up``), ``speed``
(Mb/s; -1 or unreadable when down), ``statistics/rx_errors`` and ``carrier_changes`` (two per flap).
Skipped: ``lo``, virtual interfaces (no ``device`` link: bridges, veth, docker0, bonds) and IPoIB
interfaces (``type`` 32), whose port is already reported as InfiniBand.

A port that is down reports speed 0, as the simulated backend does. Nothing here raises for one
unreadable or malformed file: that value takes its default and the rest of the port is still reported
(a heartbeat must go out whatever one driver does). ``root`` is a parameter (``/sys``), so tests read a
tree they build.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rallypoint.protocol import NicSample

_log = logging.getLogger(__name__)

SYSFS = Path("/sys")
_IB_ACTIVE = 4
_ARPHRD_INFINIBAND = "32"
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        # Some drivers answer EINVAL for ``speed`` while the link is down: routine, not worth a warning.
        _log.debug("cannot read %s: %s", path, exc)
        return None


def _int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 0


def _ib_state_active(text: str | None) -> bool:
    """``4: ACTIVE`` (the number is the IB spec's port state; the word is what older kernels wrote)."""
    if text is None:
        return False
    number, _, word = text.partition(":")
    if number.strip().isdigit():
        return int(number) == _IB_ACTIVE
    return text.strip().upper() == "ACTIVE" or word.strip().upper() == "ACTIVE"


def _ib_rate_gbps(text: str | None) -> float:
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else 0.0


def infiniband_port(device: str, port: Path) -> NicSample:
    up = _ib_state_active(_read(port / "state"))
    counters = port / "counters"
    return NicSample(
        name=f"{device}/{port.name}",
        link_up=up,
        speed_gbps=_ib_rate_gbps(_read(port / "rate")) if up else 0.0,
        errors=_int(counters / "symbol_error") + _int(counters / "port_rcv_errors"),
        link_downed=_int(counters / "link_downed"),
    )


def infiniband_ports(root: Path = SYSFS) -> list[NicSample]:
    out: list[NicSample] = []
    for device in _children(root / "class" / "infiniband"):
        for port in _children(device / "ports"):
            out.append(infiniband_port(device.name, port))
    return out


def _ethernet_up(interface: Path) -> bool:
    state = (_read(interface / "operstate") or "").lower()
    # "unknown": drivers that do not report operstate; then the carrier says whether the link is up.
    return state == "up" or (state == "unknown" and _read(interface / "carrier") == "1")


def ethernet_port(interface: Path) -> NicSample:
    up = _ethernet_up(interface)
    speed_mbps = _int(interface / "speed") if up else 0
    return NicSample(
        name=interface.name,
        link_up=up,
        speed_gbps=max(speed_mbps, 0) / 1000.0,
        errors=_int(interface / "statistics" / "rx_errors"),
        # carrier_changes counts both edges: a flap (down and up again) is two.
        link_downed=_int(interface / "carrier_changes") // 2,
    )


def _physical_ethernet(interface: Path) -> bool:
    if interface.name == "lo" or not (interface / "device").exists():
        return False
    return _read(interface / "type") != _ARPHRD_INFINIBAND


def ethernet_ports(root: Path = SYSFS) -> list[NicSample]:
    return [ethernet_port(i) for i in _children(root / "class" / "net") if _physical_ethernet(i)]


def read_nics(root: Path | str = SYSFS) -> tuple[NicSample, ...]:
    """Every InfiniBand port and physical Ethernet interface under ``root``, sorted by name."""
    base = Path(root)
    return tuple(sorted([*infiniband_ports(base), *ethernet_ports(base)], key=lambda n: n.name))


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError:
        return []  # no such class (no InfiniBand on this host) or not readable
