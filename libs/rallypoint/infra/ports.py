"""Free TCP ports for servers started by tests and local clusters."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Ports handed out by this process: never twice, even once the caller's server has stopped with them.
_HANDED_OUT: set[int] = set()
_LOWEST = 10_000
_RANDOM = random.SystemRandom()  # never the seeded global generator: tests may seed it


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range.

    Not from the ephemeral range on purpose: every outgoing connection (each service's NATS and
    PostgreSQL clients) takes its source port from there, so a listening port picked there can be taken
    by a client before its server binds it. A race with another process is still possible: callers that
    start a server retry on a bind failure instead of trusting the number blindly.
    """
    low, _ = _ephemeral_range()
    if low - _LOWEST >= 1_000:
        for _ in range(200):
            port = _RANDOM.randrange(_LOWEST, low)
            if port not in _HANDED_OUT and _bindable(host, port):
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
        _HANDED_OUT.add(port)
        return port


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on (host, port) right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
