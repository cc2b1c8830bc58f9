"""DeepSpeed is imported without its autotuner's MLflow import, in the launcher's preload and in a
fresh rank, and MLflow stays importable afterwards (the tracking publisher's process needs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from finetune_trainer.node_launcher import CPU_PRELOAD
from tests.support.training_runs import REPO

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(330)]

PROBE = textwrap.dedent(
    """
    import sys
    from finetune_trainer import node_launcher
    for name in node_launcher.CPU_PRELOAD:
        node_launcher.import_preloaded(name)
    from deepspeed.autotuning import autotuner
    print("has_mlflow", autotuner.has_mlflow)
    print("mlflow imported", "mlflow" in sys.modules)
    import mlflow.tracking
    print("mlflow after", mlflow.tracking.__name__)
    """
)


def test_the_preload_imports_deepspeed_without_mlflow_and_mlflow_still_imports_after() -> None:
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert "deepspeed" in CPU_PRELOAD
    assert out.splitlines()[-3:] == ["has_mlflow False", "mlflow imported False", "mlflow after mlflow.tracking"], out
