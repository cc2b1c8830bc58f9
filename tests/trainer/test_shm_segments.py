"""DeepSpeed's CPU shm all-reduce segments: which names a job owns, and that a real run leaves none."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from finetune_trainer.shm_segments import SHM_DIR, job_prefix, release_own, sweep

from .conftest import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]


def _segments(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"x")


def test_sweep_removes_only_this_jobs_segments(tmp_path: Path) -> None:
    uid = os.getuid()
    mine = [f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29500_{r}" for r in (0, 1, 11)]
    others = [
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_2950_0",  # another port that is a prefix of this one
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_295001_0",
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.2_29500_0",  # another master address
        f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_29500_0",  # another user's job
        f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29500_x",
        "psm_something_else",
    ]
    _segments(tmp_path, *mine, *others)
    assert sweep("127.0.0.1", 29500, shm_dir=tmp_path) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert sweep("127.0.0.1", 29500, shm_dir=tmp_path) == []
    assert sweep("127.0.0.1", 29500, shm_dir=tmp_path / "absent") == []


def test_a_rank_releases_its_own_segment_and_no_other(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    prefix = job_prefix("127.0.0.1", 29500)
    _segments(tmp_path, f"{prefix}0", f"{prefix}1")
    assert release_own(1, env, shm_dir=tmp_path) is True
    assert [p.name for p in tmp_path.iterdir()] == [f"{prefix}0"]
    assert release_own(1, env, shm_dir=tmp_path) is False  # already gone: not an error
    assert release_own(0, {}, shm_dir=tmp_path) is False  # no rendezvous address: nothing to name
    assert [p.name for p in tmp_path.iterdir()] == [f"{prefix}0"]


@pytest.mark.slow
def test_a_two_rank_cpu_run_leaves_no_segment_in_dev_shm(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run]
) -> None:
    manifest = job_manifest(str(tiny_model_dir), str(reverse_jsonl), str(tmp_path / "out"), training={"maxSteps": 2})
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    assert run.wait(240) == 0, run.log()
    assert run.summary()["steps"] == 2
    left = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(job_prefix("127.0.0.1", run.port))]
    assert left == [], f"DeepSpeed shm segments left in {SHM_DIR}: {left}"
