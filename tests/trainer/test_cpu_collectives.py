"""On CPU the ranks' collectives go through gloo alone: DeepSpeed's shared-memory all-reduce op is
neither built nor loaded (finetune_trainer.deepspeed_import), so a run leaves nothing in /dev/shm."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.timeout(300)]

SHM_DIR = Path("/dev/shm")
SEGMENT = "deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_"
"""The name DeepSpeed's shm op gives each rank's segment (the rank number follows)."""


def test_a_two_rank_cpu_run_loads_no_shm_op_and_leaves_no_segment(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), str(tmp_path / "out"), training={"maxSteps": 2})
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(240) == 0, run.log()
    assert run.summary()["steps"] == 2
    log = run.log()
    assert "deepspeed_shm_comm" not in log, log[-3000:]  # DeepSpeed prints the op's name when it loads it
    prefix = SEGMENT.format(uid=os.getuid(), port=run.port)
    left = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix)]
    assert left == [], f"DeepSpeed shm segments in {SHM_DIR}: {left}"
