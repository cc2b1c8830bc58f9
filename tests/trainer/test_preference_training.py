"""DPO and ORPO through the real entrypoint: two DeepSpeed ranks on gloo, a LoRA adapter on the tiny
model, the built-in preference set. A fresh adapter starts at DPO's log 2 (policy = reference), the
loss falls, and every step logs the rewards, their margin and the preference accuracy. Rank 0's
/metrics, read as the operator reads it, gives them to `status.progress`, and the summary carries
the final evaluation's accuracy."""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from finetune_operator.api.status import Progress
from finetune_operator.reconcile.progress import Sample, parse, to_progress
from tests.support.prometheus_server import free_port_pair
from tests.support.training_runs import Run, job_manifest, render_config, wait_for

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
        method={"type": objective, "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
        training={"maxSteps": 8, "learningRate": 0.01},
    )
    config = render_config(tmp_path / "config", manifest)
    out = tmp_path / "out"
    metrics_port = free_port_pair()
    run = launch(config, out, env={"FTJOB_METRICS_PORT": str(metrics_port)})
    scraped: list[Progress] = []  # rank 0's progress as the operator's scrape reads it, while training

    def scrape_until_done() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as response:
                values = parse(response.read().decode())
        except OSError:
            values = None
        if values is not None:
            progress = to_progress(datetime.now(UTC), Sample(at=time.time(), values=values), None)
            if progress.preference_accuracy is not None:
                scraped.append(progress)
        return run.proc.poll() is not None

    assert wait_for(scrape_until_done, 480, interval=0.2)
    assert run.wait(60) == 0, run.log()[-4000:]
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
    assert run.summary()["evalPreferenceAccuracy"] == evals[-1]["eval_preference_accuracy"]
    assert scraped, "no scrape of rank 0 saw a step's preference accuracy"
    for key in ("preference_accuracy", "reward_margin", "rewards_chosen", "rewards_rejected"):
        logged = {round(e[key], 4) for e in steps}
        for progress in scraped:  # some step's value (a scrape may land between two steps' gauges)
            assert getattr(progress, key) in logged, (key, progress)
    assert all(p.eval_preference_accuracy is not None for p in scraped)  # the evaluation before step 1
    # a built-in set: greedy answers to held-out prompts, compared with the chosen ones
    for evaluation in evals:
        assert 0.0 <= evaluation["exact_match"] <= 1.0 and evaluation["examples"], evaluation
        assert all(" " in e["expected"] and isinstance(e["got"], str) for e in evaluation["examples"]), evaluation
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_full_model_dpo_compares_against_a_frozen_copy(
    tmp_path: Path, tiny_model_dir: Path, launch: Callable[..., Run], zero_stage: int
) -> None:
    """`preference.base: full`: every weight trains, and the reference is a frozen copy of the base in
    its own engine (partitioned like the policy under ZeRO-3). At the first step the two are equal
    (loss log 2, margin 0); after that the policy moves away from the copy, which does not move."""
    manifest = job_manifest(
        str(tiny_model_dir),
        "builtin://secret-code-preference",
        "/out",
        dataset={"format": "preference", "maxSeqLength": 48, "validationSplit": 0.01},
        method={"type": "dpo", "preference": {"base": "full", "beta": 0.5}},
        training={"maxSteps": 6, "learningRate": 0.0005},
        deepspeed={"zeroStage": zero_stage},
    )
    out = tmp_path / "out"
    run = launch(render_config(tmp_path / "config", manifest), out)
    assert run.wait(480) == 0, run.log()[-4000:]
    steps = [e for e in run.train_log() if "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, 7))
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert steps[0]["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert any(abs(e["reward_margin"]) > 1e-4 for e in steps[1:]), steps  # the policy left its reference
    assert min(e["loss"] for e in steps[-3:]) < steps[0]["loss"], [e["loss"] for e in steps]
