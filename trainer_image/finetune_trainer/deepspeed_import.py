"""Import DeepSpeed without the optional MLflow import of its autotuner, and without its CPU shm op.

`deepspeed.runtime.config` imports `deepspeed.autotuning`, whose autotuner imports `mlflow`
whenever it is installed (it is: the tracking publisher needs it). That is 1.1 s of CPU in each
process that imports DeepSpeed first here (the node launcher's preload, every rank started
afresh), for code a training rank never runs: the autotuner belongs to the `deepspeed
--autotuning` launcher. While DeepSpeed is imported here `import mlflow` fails, so the
autotuner records that it has none; afterwards `import mlflow` works as usual in the process.

On a CPU node DeepSpeed's comm backend also loads its shared-memory all-reduce op
(`deepspeed_shm_comm`) whenever `init_distributed` runs. Training never calls the one collective
it serves (`inference_all_reduce`, for tensor-parallel inference): every training collective goes
through the gloo process group. Loading it cost what training did not need: a just-in-time C++
build (about 40 CPU-s, in every new extensions folder, and the image has no compiler), a lock file
that a rank killed mid-load leaves behind for every later rank to wait on forever (torch's
FileBaton has no timeout), about 66 MB of /dev/shm per rank charged to the pod's memory, and a
setup in which a rank waits in C++, holding the GIL, for each peer's segment. So the op is marked
incompatible here, and DeepSpeed's backend skips it (`build_shm_op` returns None).
"""

from __future__ import annotations

import sys
from types import ModuleType

SKIPPED = "mlflow"
SHM_OP = "deepspeed_shm_comm"
"""DeepSpeed's CPU shared-memory all-reduce op (ShareMemCommBuilder.NAME)."""


def import_deepspeed() -> ModuleType:
    """`deepspeed`, imported now (with `mlflow` hidden from it) unless it was already, with its CPU
    shm op switched off."""
    if "deepspeed" in sys.modules:
        return _without_shm_op(sys.modules["deepspeed"])
    hide = SKIPPED not in sys.modules
    if hide:
        sys.modules[SKIPPED] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        import deepspeed

        module: ModuleType = deepspeed
    finally:
        if hide and sys.modules.get(SKIPPED, 0) is None:
            del sys.modules[SKIPPED]
    return _without_shm_op(module)


def _without_shm_op(deepspeed: ModuleType) -> ModuleType:
    """Mark the shm op incompatible, so that DeepSpeed's comm backend never builds or loads it."""
    deepspeed.ops.__compatible_ops__[SHM_OP] = False
    return deepspeed
