"""Each process node's slice of 127.2.0.0/16, unique among the local clusters of one machine.

Why: process nodes share the host network, and every job uses the same rendezvous port
(MASTER_PORT 29500) and metrics port. Two clusters whose process nodes hand out the same pod
IPs (two test runs at once on one machine) make each other's ranks fail with EADDRINUSE,
which the operator rightly counts as rank failures. So a node claims its /24 under an
exclusive `flock` on a file named after the slice in the temp dir, held for the agent's
lifetime: the kernel drops the lock when the agent exits, however it exits. The search starts
at a random slice, so nodes that start at the same moment seldom contend.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import random
import tempfile
from pathlib import Path

POOL = ipaddress.IPv4Network("127.2.0.0/16")


class NoFreeSlice(RuntimeError):
    pass


def claim(lock_dir: Path | None = None, first: int | None = None) -> tuple[str, int]:
    """A free /24 of the pool and the descriptor that holds its lock (keep it open)."""
    folder = lock_dir or Path(tempfile.gettempdir())
    slices = list(POOL.subnets(new_prefix=24))
    start = random.randrange(len(slices)) if first is None else first
    for k in range(len(slices)):
        net = slices[(start + k) % len(slices)]
        fd = os.open(folder / f"ftjob-pod-cidr-{net.network_address}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return str(net), fd
    raise NoFreeSlice(f"every /24 of {POOL} is held by another process node")
