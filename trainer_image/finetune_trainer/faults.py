"""Faults a test sets off at a named point of a rank's work, through the environment.

The points are where a real failure hurts most (a save, a conversion, an upload); see
`fault_point`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from finetune_operator.api.pod_env import PodEnv


def fault_point(where: str, step: int, once_in: Path | None = None) -> None:
    """Fault injection for the resume tests: FTJOB_FAULT_KILL=<where>:<step> SIGKILLs this rank
    there; FTJOB_FAULT_STOP=<where>:<step> SIGSTOPs it, so a test can kill the whole pod at a
    known step instead of racing the training loop; FTJOB_FAULT_OOM=<where>:<step> raises a
    real `torch.OutOfMemoryError` there, as a CUDA allocation would, so the operator's
    out-of-memory re-plan can be driven by real ranks; FTJOB_FAULT_SLOW=<where>:<step> makes the
    rank sleep FTJOB_FAULT_SLOW_SECONDS (5) there, as a large model's conversion or export would
    take long. Each variable may name several points,
    comma-separated. With `once_in` (the output folder) a kill or an out-of-memory error fires
    once per rank and point (a marker is kept there, or in FTJOB_FAULT_ONCE_DIR when set): the
    restarted gang, started with the same environment, passes it and meets the next one."""
    here = f"{where}:{step}"

    def armed(variable: str) -> bool:
        return here in os.environ.get(variable, "").split(",")

    def first_time(kind: str) -> bool:
        if once_in is None:
            return True
        folder = Path(os.environ.get("FTJOB_FAULT_ONCE_DIR") or once_in)  # e.g. outliving a pod's scratch
        marker = folder / f".fault-{kind}-{where}-{step}-rank{os.environ.get(PodEnv.RANK, '0')}"
        if marker.exists():
            return False
        marker.touch()
        return True

    if armed("FTJOB_FAULT_OOM") and first_time("oom"):
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory (injected by FTJOB_FAULT_OOM={here})")
    if armed("FTJOB_FAULT_KILL") and first_time("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if armed("FTJOB_FAULT_SLOW"):
        time.sleep(float(os.environ.get("FTJOB_FAULT_SLOW_SECONDS", "5")))
    if armed("FTJOB_FAULT_STOP"):
        os.kill(os.getpid(), signal.SIGSTOP)
