"""Free TCP ports for servers started by tests and local clusters."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago.

    The kernel picks it (bind to port 0), so two calls rarely collide; the socket is closed before
    returning, so a race with another process is possible: callers that start a server retry on a
    bind failure instead of trusting the number blindly.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on (host, port) right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
