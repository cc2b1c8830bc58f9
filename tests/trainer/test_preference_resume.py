"""A preference job keeps its work like an SFT job: a DPO run SIGKILLed between two checkpoints
and resumed, or resumed under a re-planned strategy (ZeRO-2 on two ranks -> ZeRO-3 with optimizer
offload), ends where the uninterrupted run ends: every step's loss, reward margin and accuracy
after the resume, and the final adapter, within 1e-6 (fp32 on CPU).

Two gloo ranks, LoRA, the built-in preference set; every micro-batch is whole pairs (chosen rows
first), so the data position a checkpoint records is a position in pairs. DPO's reference is the
base with the adapter off: nothing of it is saved, and a resumed run compares against the same
reference. A full-model DPO resumes its policy from the checkpoint and reloads the frozen copy
from the base (not from the checkpoint): its step after the resume repeats the killed run's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 8
CHECKPOINT_EVERY = 3
TOLERANCE = 1e-6


def _manifest(model: Path, zero: int, offload: str = "none", base: str = "lora") -> dict[str, Any]:
    method: dict[str, Any] = {"type": "dpo", "preference": {"base": base, "beta": 0.2}}
    if base == "lora":
        method["lora"] = {"r": 8, "alpha": 16, "dropout": 0.0}
    return job_manifest(
        str(model),
        "builtin://secret-code-preference",
        "/out",
        dataset={"format": "preference", "maxSeqLength": 48, "validationSplit": 0.01},
        method=method,
        training={
            "maxSteps": STEPS,
            "microBatchSize": 2,
            "globalBatchSize": 8,
            "checkpointEverySteps": CHECKPOINT_EVERY,
            "checkpointsToKeep": 2,
            "learningRate": 0.01 if base == "lora" else 0.0005,
            "warmupRatio": 0.2,
        },
        deepspeed={"zeroStage": zero, "offloadOptimizer": offload},
    )


def _adapter(out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(out / "adapter" / "adapter_model.safetensors"))


def _per_step(run: Run) -> dict[int, tuple[float, float, float]]:
    """(loss, reward margin, accuracy) per step; a resumed run's record of a step wins."""
    return {
        e["step"]: (e["loss"], e["reward_margin"], e["preference_accuracy"]) for e in run.train_log() if "loss" in e
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Path, Run]:
    from tests.support.training_runs import start_train

    root = tmp_path_factory.mktemp("dpo-uninterrupted")
    run = start_train(render_config(root / "config", _manifest(tiny_model_dir, 2)), root / "out")
    try:
        assert run.wait(300) == 0, run.log()[-3000:]
    finally:
        run.kill()
    return root / "out", run


def _kill_then_resume(
    tmp_path: Path, launch: Callable[..., Run], first: dict[str, Any], second: dict[str, Any]
) -> tuple[Run, Run]:
    out = tmp_path / "out"
    kill_at = CHECKPOINT_EVERY + 2  # two steps past the checkpoint: they are lost and redone
    killed = launch(
        render_config(tmp_path / "c1", first), out, tag="killed", env={"FTJOB_FAULT_KILL": f"step:{kill_at}"}
    )
    assert killed.wait(300) != 0 and not (out / "COMPLETED.json").exists(), killed.log()[-3000:]
    assert max(killed.losses()) == kill_at
    resumed = launch(render_config(tmp_path / "c2", second), out, tag="resumed")
    assert resumed.wait(300) == 0, resumed.log()[-3000:]
    assert resumed.summary()["resumedFromStep"] == CHECKPOINT_EVERY, resumed.log()[-3000:]
    return killed, resumed


def _assert_ends_equal(resumed: Run, reference: Run, reference_out: Path) -> None:
    mine, theirs = _per_step(resumed), _per_step(reference)
    assert sorted(mine) == list(range(1, STEPS + 1))
    worst = 0.0
    for step in range(CHECKPOINT_EVERY + 1, STEPS + 1):
        for a, b in zip(mine[step], theirs[step], strict=True):
            worst = max(worst, abs(a - b))
            assert a == pytest.approx(b, rel=TOLERANCE, abs=TOLERANCE), f"step {step}: {mine[step]} vs {theirs[step]}"
    adapter, expected = _adapter(resumed.output), _adapter(reference_out)
    assert adapter.keys() == expected.keys()
    weights = max(float((adapter[k] - expected[k]).abs().max()) for k in adapter)
    print(f"largest difference: per-step values {worst:.3e}, adapter weights {weights:.3e}")
    assert weights <= TOLERANCE


@pytest.mark.timeout(900)
def test_a_sigkilled_dpo_job_resumes_to_the_uninterrupted_result(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run], uninterrupted: tuple[Path, Run]
) -> None:
    job = _manifest(tiny_model_dir, 2)
    killed, resumed = _kill_then_resume(tmp_path, launch, job, job)
    # the step the kill lost is redone on the same pairs: its loss is the one the killed run logged
    assert _per_step(resumed)[CHECKPOINT_EVERY + 1] == pytest.approx(
        _per_step(killed)[CHECKPOINT_EVERY + 1], abs=TOLERANCE
    )
    _assert_ends_equal(resumed, uninterrupted[1], uninterrupted[0])


@pytest.mark.timeout(900)
def test_a_replanned_dpo_job_resumes_under_another_strategy_to_the_uninterrupted_result(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run], uninterrupted: tuple[Path, Run]
) -> None:
    """As after an out-of-memory re-plan: ZeRO-2 killed, resumed at ZeRO-3 with optimizer offload."""
    _, resumed = _kill_then_resume(
        tmp_path, launch, _manifest(tiny_model_dir, 2), _manifest(tiny_model_dir, 3, offload="cpu")
    )
    assert "written by ZeRO-2" in resumed.log(), resumed.log()[-3000:]
    _assert_ends_equal(resumed, uninterrupted[1], uninterrupted[0])


@pytest.mark.timeout(900)
def test_a_full_model_dpo_job_resumes_across_zero_stages_against_the_same_frozen_copy(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run]
) -> None:
    """The policy's DeepSpeed shards are converted (ZeRO-2 -> ZeRO-3); the reference is the base
    again, so the redone step's loss, margin and accuracy repeat the killed run's."""
    killed, resumed = _kill_then_resume(
        tmp_path, launch, _manifest(tiny_model_dir, 2, base="full"), _manifest(tiny_model_dir, 3, base="full")
    )
    assert "DeepSpeed shards converted to the universal checkpoint" in resumed.log(), resumed.log()[-3000:]
    redone, before = _per_step(resumed)[CHECKPOINT_EVERY + 1], _per_step(killed)[CHECKPOINT_EVERY + 1]
    assert redone == pytest.approx(before, rel=1e-5, abs=1e-5), (redone, before)
