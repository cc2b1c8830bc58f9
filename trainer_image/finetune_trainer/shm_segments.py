"""DeepSpeed's shared-memory all-reduce segments on CPU: unlinked once every rank has mapped them.

When every rank of a job runs on one host, DeepSpeed's CPU comm backend creates one POSIX
shared-memory segment per rank, `/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_
<MASTER_PORT>_<rank>` (about 66 MB each), and each rank maps every peer's. DeepSpeed never
unlinks them, so every run left its ranks' segments behind: RAM in a tmpfs, charged to the pod's
memory and, on a shared host, piling up run after run until the host runs out.

A segment's name can go as soon as every peer has mapped it; the memory lives until the last
mapping is gone. So each rank unlinks its own name after a barrier that follows
`init_distributed` (a rank reaches that barrier only after mapping all its peers' segments), and
the launcher sweeps its job's names once its ranks have exited, for a rank killed before that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SHM_DIR = Path("/dev/shm")
NAME = "deepspeed_allreduce_buffer"


def job_prefix(master_addr: str, master_port: int | str, uid: int | None = None) -> str:
    """The name every segment of one job starts with; the rank number follows it."""
    return f"{NAME}_{os.getuid() if uid is None else uid}_{master_addr}_{master_port}_"


def release_own(rank: int, env: Mapping[str, str] = os.environ, shm_dir: Path = SHM_DIR) -> bool:
    """Unlink this rank's segment; call it only once every rank has passed init (a barrier)."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        return False
    try:
        (shm_dir / f"{job_prefix(addr, port)}{rank}").unlink()
    except FileNotFoundError:  # not all ranks on this host, or DeepSpeed without its shm op
        return False
    return True


def sweep(master_addr: str, master_port: int | str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink whatever segments of this job are left (ranks killed before they released theirs)."""
    prefix = job_prefix(master_addr, master_port)
    removed: list[str] = []
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return removed
    for path in entries:
        rank = path.name[len(prefix) :]
        if path.name.startswith(prefix) and rank.isdigit():
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(path.name)
    return sorted(removed)
