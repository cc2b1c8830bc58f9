"""Every tensor a rank hands to a collective is on the rank's device (issue 13, defect 1).

Under NCCL a host tensor in a collective fails the first step of every multi-GPU job; gloo
accepts it, so this tier runs each rank with finetune_trainer.rank.collective_check, which
fails the run at the first collective given a tensor the trainer built without a device
or one on another device. Here: two ranks under ZeRO-2 and ZeRO-3 through training,
evaluation (loss and exact match) and a checkpoint; the reports prove the guard saw the
trainer's own sums and DeepSpeed's collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stage", [2, 3])
def test_collectives_get_tensors_on_the_rank_device(
    tmp_path: Path, tiny_model_dir: Path, reverse_jsonl: Path, launch: Callable[..., Run], stage: int
) -> None:
    manifest = job_manifest(
        str(tiny_model_dir),
        str(reverse_jsonl),
        "/out",
        deepspeed={"zeroStage": stage},
        training={"maxSteps": 2, "checkpointEverySteps": 1, "evalEverySteps": 1},
    )
    run = launch(render_config(tmp_path / "config", manifest), tmp_path / "out")
    code = run.wait(220)
    reports = run.collective_reports()
    assert set(reports) == {0, 1}, run.log()[-3000:]
    for rank, report in reports.items():
        assert report["violations"] == [], (rank, report["violations"])
        assert report["device"] == "cpu"
        # the trainer's per-step and evaluation sums, and the engine's own collectives
        assert report["checked"].get("all_reduce", 0) >= 3, report
        if stage == 3:
            assert report["checked"].get("all_gather_into_tensor", 0) > 0, report
    assert code == 0, run.log()[-3000:]
