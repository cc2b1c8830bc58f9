"""DeepSpeed is imported without its autotuner's MLflow import, in the launcher's preload and in a
fresh rank, and MLflow stays importable afterwards (the tracking publisher's process needs it).
Its CPU shm all-reduce op is switched off: the comm backend's loader returns nothing, builds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from finetune_trainer.pod.node_launcher import CPU_PRELOAD
from tests.support.training_runs import REPO

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(330)]

PROBE = textwrap.dedent(
    """
    import sys
    from finetune_trainer.pod import node_launcher
    for name in node_launcher.CPU_PRELOAD:
        node_launcher.import_preloaded(name)
    from deepspeed.autotuning import autotuner
    print("has_mlflow", autotuner.has_mlflow)
    print("mlflow imported", "mlflow" in sys.modules)
    import mlflow.tracking
    print("mlflow after", mlflow.tracking.__name__)
    from deepspeed.comm.torch import build_shm_op
    print("shm op", build_shm_op())
    """
)


def test_the_preload_imports_deepspeed_without_mlflow_and_mlflow_still_imports_after(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(extensions))
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert "deepspeed" in CPU_PRELOAD
    assert out.splitlines()[-4:] == [
        "has_mlflow False",
        "mlflow imported False",
        "mlflow after mlflow.tracking",
        "shm op None",
    ], out
    assert not extensions.exists(), list(extensions.rglob("*"))  # nothing was built
