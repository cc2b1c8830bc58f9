"""Import DeepSpeed without the optional MLflow import of its autotuner.

`deepspeed.runtime.config` imports `deepspeed.autotuning`, whose autotuner imports `mlflow`
whenever it is installed (it is: the tracking publisher needs it). That is 1.1 s of CPU in each
process that imports DeepSpeed first here (the node launcher's preload, every rank started
afresh), for code a training rank never runs: the autotuner belongs to the `deepspeed
--autotuning` launcher. While DeepSpeed is imported here `import mlflow` fails, so the
autotuner records that it has none; afterwards `import mlflow` works as usual in the process.
"""

from __future__ import annotations

import sys
from types import ModuleType

SKIPPED = "mlflow"


def import_deepspeed() -> ModuleType:
    """`deepspeed`, imported now (with `mlflow` hidden from it) unless it was already."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = SKIPPED not in sys.modules
    if hide:
        sys.modules[SKIPPED] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        import deepspeed

        module: ModuleType = deepspeed
    finally:
        if hide and sys.modules.get(SKIPPED, 0) is None:
            del sys.modules[SKIPPED]
    return module
