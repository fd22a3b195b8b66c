"""Loopback: free ports (for the demo, the tests and the processes they start), and telling a
loopback host from one on the network."""

from __future__ import annotations

import ipaddress
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    """Whether a host stays on this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
