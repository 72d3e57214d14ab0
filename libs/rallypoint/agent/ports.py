"""Whose is a TCP port on this node: the listeners in ``/proc/net/tcp`` and ``tcp6``, with their owners.

A job publishes ports (``JobSpec.ports``: a notebook's 8888) and its team reaches them through the API
(``rally port-forward``); the agent connects to the port on the node's loopback. Ranks share the node's
network, so any process could be listening on that port: before connecting, the agent makes sure the
listener belongs to the rank's own user (a job's ranks run as a uid of their own, ``rankuser``), so a
user's connection, and the notebook token in it, never reaches another job's process that took the port
first. Where ranks run as the agent's own user (the demo's and the tests' one-user clusters) that check
cannot tell jobs apart (docs/security.md).

The parsing is pure (``listeners``); ``loopback_target`` reads the tables.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


class PortRefused(Exception):
    """Nothing of the rank's listens on the port, or someone else's process does."""


@dataclass(frozen=True)
class Listener:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    uid: int


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The kernel prints each 32-bit word of an address in host order (little-endian here)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.IPv4Address(words) if len(words) == 4 else ipaddress.IPv6Address(words)


def listeners(tables: Iterable[str]) -> list[Listener]:
    """Every listening socket in the text of ``/proc/net/tcp``-style tables."""
    found: list[Listener] = []
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or fields[3] != _LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            found.append(Listener(_address(address), int(port, 16), int(fields[7])))
    return found


def _reaches_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address.is_loopback or address.is_unspecified


def target(port: int, uid: int, found: Iterable[Listener]) -> str:
    """The loopback address to connect to for ``port``, whose listener must be ``uid``'s."""
    on_port = [
        listener for listener in found if listener.port == port and _reaches_loopback(listener.address)
    ]
    if not on_port:
        raise PortRefused(f"nothing listens on port {port} (on the loopback or every address) yet")
    if any(listener.uid != uid for listener in on_port):
        raise PortRefused(f"port {port} on this node is held by another user's process, not the job's")
    return "127.0.0.1" if any(listener.address.version == 4 for listener in on_port) else "::1"


def loopback_target(port: int, uid: int) -> str:
    return target(port, uid, listeners(_read(path) for path in TABLES))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # no IPv6 on this host
        return ""
