"""Each rank's share of its pod's CPUs: OMP_NUM_THREADS and MKL_NUM_THREADS.

Unset, torch and MKL start one thread per host core in every rank: eight ranks on a 128-core GPU
node ran 1,024 threads for CPU Adam (offload) and batch building. The operator renders both from
`resources.cpu` divided by the pod's ranks; without a CPU request the node launcher divides the
CPUs the pod may run on (its affinity mask) among its ranks. A user's own value wins. The
standard library only: the node launcher imports no torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""PodEnv.OMP_NUM_THREADS and MKL_NUM_THREADS: each rank's CPU threads (OpenMP's and MKL's pools)."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a static CPU manager narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share(base: Mapping[str, str], local_ranks: int, cpus: int) -> dict[str, str]:
    """OMP_NUM_THREADS and MKL_NUM_THREADS for each of `local_ranks` ranks sharing `cpus`, where
    `base` (the pod's environment) does not set them; MKL follows a given OMP_NUM_THREADS."""
    each = str(max(1, cpus // max(1, local_ranks)))
    given = base.get(THREAD_VARIABLES[0])
    return {name: base.get(name) or given or each for name in THREAD_VARIABLES}


def apply(env: Mapping[str, str]) -> None:
    """A forked child's torch was initialised with the launcher's thread count: give it the rank's."""
    torch = sys.modules.get("torch")
    threads = env.get(THREAD_VARIABLES[0], "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
