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

The names say nothing about which run made them: two local runs on one master port share
them. A run that lost the port (EADDRINUSE) must not sweep the names of the live run that
holds it: in the middle of that run's setup, one of its ranks would then wait forever for a
peer's segment (DeepSpeed's `shm_initialize` retries `shm_open` until the name exists). So
the sweep leaves every name alone while anything still listens on the port (a live run's
rendezvous store, which lives as long as its rank 0), and takes only segments created since
this run started.
"""

from __future__ import annotations

import errno
import faulthandler
import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from finetune_operator.api.pod_env import PodEnv

from .outcome import TRAINING_ERROR, clear_rank_failure, write_rank_failure

SHM_DIR = Path("/dev/shm")
NAME = "deepspeed_allreduce_buffer"
DEFAULT_SETUP_SECONDS = 120.0


def job_prefix(master_addr: str, master_port: int | str, uid: int | None = None) -> str:
    """The name every segment of one job starts with; the rank number follows it."""
    return f"{NAME}_{os.getuid() if uid is None else uid}_{master_addr}_{master_port}_"


def release_own(rank: int, env: Mapping[str, str] = os.environ, shm_dir: Path = SHM_DIR) -> bool:
    """Unlink this rank's segment; call it only once every rank has passed init (a barrier)."""
    addr, port = env.get(PodEnv.MASTER_ADDR), env.get(PodEnv.MASTER_PORT)
    if not addr or not port:
        return False
    try:
        (shm_dir / f"{job_prefix(addr, port)}{rank}").unlink()
    except FileNotFoundError:  # not all ranks on this host, or DeepSpeed without its shm op
        return False
    return True


def setup_seconds(env: Mapping[str, str] = os.environ) -> float:
    """The bound on DeepSpeed's shared-memory setup (FTJOB_SHM_SETUP_TIMEOUT_SECONDS)."""
    try:
        return max(1.0, float(env.get("FTJOB_SHM_SETUP_TIMEOUT_SECONDS", DEFAULT_SETUP_SECONDS)))
    except ValueError:
        return DEFAULT_SETUP_SECONDS


@contextmanager
def bounded_setup(state_dir: Path, rank: int, master_addr: str, master_port: str, seconds: float) -> Iterator[None]:
    """End this rank with a clear root cause if DeepSpeed's shm setup outlives `seconds`.

    `shm_initialize` loops in C++ holding the GIL, so no Python timer or signal handler can
    run: faulthandler's watchdog is a C thread that dumps the stacks and `_exit(1)`s. The
    root cause is written before and withdrawn once setup returned; the launcher then
    stops the peers, and the run fails instead of hanging.
    """
    line = (
        f"{TRAINING_ERROR}: DeepSpeed's shared-memory setup (shm_initialize) did not finish within "
        f"{seconds:g} s on rank {rank}: a peer's segment /dev/shm/{job_prefix(master_addr, master_port)}<rank> "
        f"never appeared or was removed, e.g. by another local run on master port {master_port}; "
        "give each local run its own port (ftjob run --master-port); FTJOB_SHM_SETUP_TIMEOUT_SECONDS sets this limit"
    )
    write_rank_failure(state_dir, rank, line)
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    clear_rank_failure(state_dir, rank)


def port_in_use(port: int | str) -> bool:
    """Whether some process on this host listens on the TCP port (a live run's rendezvous store)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        with probe:
            # SO_REUSEADDR: our own closed ranks' connections in TIME_WAIT are not "in use"
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, int(port)))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def sweep(
    master_addr: str, master_port: int | str, shm_dir: Path = SHM_DIR, created_since: float | None = None
) -> list[str]:
    """Unlink what is left of this job's segments (ranks killed before they released theirs).

    Nothing is removed while the port is in use (another live run owns those names now);
    with `created_since` (a time.time()), only segments created at or after it.
    """
    prefix = job_prefix(master_addr, master_port)
    removed: list[str] = []
    try:
        entries = [p for p in shm_dir.iterdir() if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()]
    except OSError:
        return removed
    if not entries or port_in_use(master_port):
        return removed
    for path in entries:
        try:
            if created_since is not None and path.stat().st_ctime < created_since:
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path.name)
    return sorted(removed)
