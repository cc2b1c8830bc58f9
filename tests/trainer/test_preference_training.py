"""DPO and ORPO through the real entrypoint: two DeepSpeed ranks on gloo, a LoRA adapter on the tiny
model, the built-in preference set. A fresh adapter starts at DPO's log 2 (policy = reference), the
loss falls, and every step logs the rewards, their margin and the preference accuracy."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.training_runs import Run, job_manifest, render_config

pytestmark = [pytest.mark.trainer, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_two_ranks_train_a_preference_objective(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run], objective: str
) -> None:
    manifest = job_manifest(
        str(tiny_model_dir),
        "builtin://secret-code-preference",
        "/out",
        dataset={"format": "preference", "maxSeqLength": 48, "validationSplit": 0.01},
        method={"type": "lora", "objective": objective, "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        training={"maxSteps": 8, "learningRate": 0.01},
    )
    config = render_config(tmp_path / "config", manifest)
    out = tmp_path / "out"
    run = launch(config, out)
    assert run.wait(480) == 0, run.log()[-4000:]
    steps = [e for e in run.train_log() if "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, 9))
    for entry in steps:
        assert {"rewards_chosen", "rewards_rejected", "reward_margin", "preference_accuracy"} <= entry.keys()
        assert 0.0 <= entry["preference_accuracy"] <= 1.0
        assert entry["reward_margin"] == pytest.approx(entry["rewards_chosen"] - entry["rewards_rejected"], abs=1e-6)
    if objective == "dpo":  # B = 0: the policy is its reference at the first step
        assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
        assert steps[0]["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert min(e["loss"] for e in steps[-3:]) < steps[0]["loss"], [e["loss"] for e in steps]
    evals = [e["eval"] for e in run.train_log() if "eval" in e]
    assert evals and {"eval_loss", "eval_preference_accuracy", "eval_reward_margin"} <= evals[-1].keys(), evals
    assert 0.0 <= evals[-1]["eval_preference_accuracy"] <= 1.0
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
