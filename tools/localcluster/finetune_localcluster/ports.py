"""Free ports for the local servers and rendezvous that tests and the demo start on loopback.

A port found by binding port 0 comes from the kernel's ephemeral range, the same range every
outgoing connection on the machine takes its local port from: between the pick and the
server's own bind, a client of another server (an apiserver watch, an S3 upload) can take it,
and the server then fails with EADDRINUSE. That happened to a rank's rendezvous while CI ran
three lanes side by side. Ports picked below the ephemeral range are only ever taken by
another listener, which the bind test here sees.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

SPAN = 12000
"""How many ports below the ephemeral range to pick from."""

_RANDOM = random.SystemRandom()  # a test that seeds `random` must not make two processes pick alike


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def candidate_ports(low: int, high: int) -> range:
    """Ports outside [low, high]: below it where there is room, else above it."""
    if low - 1024 >= 2048:
        return range(max(1024, low - SPAN), low)
    return range(high + 1, 65536)


def free_port(host: str = "127.0.0.1") -> int:
    """A port outside the ephemeral range that nothing on `host` listens on or holds now."""
    ports = candidate_ports(*ephemeral_range())
    for _ in range(200):
        port = _RANDOM.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))  # without SO_REUSEADDR: a port in TIME_WAIT counts as taken
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {ports.start}-{ports.stop - 1} after 200 tries")
