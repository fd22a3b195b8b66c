"""Loopback: free ports (for the demo, the tests and the processes they start), and telling a
loopback host from one on the network."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
from pathlib import Path

# Where free ports are looked for: below the kernel's ephemeral range. A port from that range
# (what bind(0) hands out) can be taken by any process's next outgoing connection between the
# moment it was found free and the moment the caller's child binds it; on a busy host with many
# connections that happened. Ports below it are only ever taken by someone binding them.
_LOWEST = 10_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Not the random module's shared state: a test that seeds it would make parallel test workers
# pick the same ports.
_pick = random.SystemRandom()
# "LOW-HIGH": where free_port() looks instead. Processes that pick ports at the same time (test
# workers, and the processes each one starts) are given ranges of their own, so that one cannot
# take the port another picked before its child has bound it.
RANGE_ENV = "REACH_FREE_PORT_RANGE"


def _ephemeral_floor() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _search_range() -> tuple[int, int]:
    """[low, high) to pick from: REACH_FREE_PORT_RANGE when it is set and sane, else from
    10000 up to the ephemeral range."""
    raw = os.environ.get(RANGE_ENV, "")
    low_s, _, high_s = raw.partition("-")
    if low_s.strip().isdigit() and high_s.strip().isdigit():
        low, high = int(low_s), int(high_s)
        if 1_024 <= low < high <= 65_536:
            return low, high
    return _LOWEST, _ephemeral_floor()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range when there
    is room there (else one the kernel picks)."""
    low, high = _search_range()
    if high - low >= 100:
        for _ in range(50):
            port = _pick.randrange(low, high)
            if _bindable(port):
                return port
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
