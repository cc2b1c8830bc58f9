"""Free ports for the local servers and rendezvous that tests and the demo start on loopback.

A port found by binding port 0 comes from the kernel's ephemeral range, the same range every
outgoing connection on the machine takes its local port from: between the pick and the
server's own bind, a client of another server (an apiserver watch, an S3 upload) can take it,
and the server then fails with EADDRINUSE. That happened to a rank's rendezvous while CI ran
three lanes side by side. Ports picked below the ephemeral range are only ever taken by
another listener, which the bind test here sees.

A bind test alone still lets two processes pick the same port: between one's pick and its
server's bind (a rank's rendezvous binds seconds later on a loaded machine), another process's
bind test finds the port free and hands it out too. A rank's TCPStore then met an HTTP server on
its port in a CI run. So each pick also takes a lease, a file named by the port in a directory
every process of this user shares, made with O_EXCL; a port leased in the last `LEASE_S` seconds
is not handed out again.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
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


LEASE_S = 900.0
"""How long a picked port stays reserved for its picker (a server starts well within it)."""
LEASES = Path(tempfile.gettempdir()) / f"ftjob-port-leases-{os.getuid()}"
"""One empty file per port picked recently, by any process of this user."""


def _lease(port: int, now: float) -> bool:
    """Take the lease on `port`: False when another pick holds one younger than `LEASE_S`."""
    path = LEASES / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileNotFoundError:
            LEASES.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            try:
                if now - path.stat().st_mtime < LEASE_S:
                    return False
                path.unlink()  # a stale lease: take it over
            except FileNotFoundError:
                pass  # its owner or another picker removed it meanwhile: try again
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port outside the ephemeral range that nothing on `host` listens on or holds now, and that
    no other pick on this machine got in the last `LEASE_S` seconds."""
    ports = candidate_ports(*ephemeral_range())
    for _ in range(200):
        port = _RANDOM.choice(ports)
        if not _lease(port, time.time()):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))  # without SO_REUSEADDR: a port in TIME_WAIT counts as taken
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {ports.start}-{ports.stop - 1} after 200 tries")
