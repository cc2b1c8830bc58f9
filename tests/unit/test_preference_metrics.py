"""A preference job's rewards and accuracy, from the trainer's gauges to `status.progress`.

The trainer sets the gauges from a step's train-log entry and an evaluation's result (an SFT
job has neither key, and its gauges stay NaN); the operator's scrape turns rank 0's exposition
into `status.progress`, and a success keeps the last scraped values with the summary's final
evaluation. An SFT job's status carries none of the new fields."""

from __future__ import annotations

import json
import math

from prometheus_client import CollectorRegistry, generate_latest

from finetune_operator.api.pod_contract import TrainingSummary
from finetune_operator.api.status import Progress
from finetune_operator.reconcile.progress import Sample, parse, to_progress
from finetune_trainer.metrics.progress import ProgressMetrics
from tests.support.lifecycle import NOW, exited, job_with, pod, run, step

PREFERENCE_STEP = {
    "step": 3,
    "loss": 0.61,
    "lr": 1e-4,
    "rewards_chosen": 0.25,
    "rewards_rejected": -0.125,
    "reward_margin": 0.375,
    "preference_accuracy": 0.75,
}
SFT_STEP = {"step": 3, "loss": 1.5, "lr": 1e-4, "grad_norm": 0.5, "tokens": 100, "epoch": 0.1}
GAUGES = (
    "finetune_train_reward_chosen",
    "finetune_train_reward_rejected",
    "finetune_train_reward_margin",
    "finetune_train_preference_accuracy",
    "finetune_eval_preference_accuracy",
)


def value(registry: CollectorRegistry, name: str) -> float:
    found = registry.get_sample_value(name)
    assert found is not None, name
    return found


def scraped(metrics: ProgressMetrics) -> Progress:
    values = parse(generate_latest(metrics.registry).decode())
    assert values is not None
    return to_progress(NOW, Sample(at=1.0, values=values), None)


def test_a_preference_step_sets_the_reward_gauges_and_an_sft_step_leaves_them_unknown() -> None:
    sft = ProgressMetrics(CollectorRegistry(), {"rank": "0"})
    sft.preference_step(SFT_STEP)
    sft.evaluated({"eval_loss": 1.25})
    assert all(math.isnan(value(sft.registry, name)) for name in GAUGES)  # exported, but no 0 that reads as data
    assert value(sft.registry, "finetune_eval_loss") == 1.25

    dpo = ProgressMetrics(CollectorRegistry(), {"rank": "0"})
    dpo.preference_step(PREFERENCE_STEP)
    dpo.evaluated({"eval_loss": 0.6, "eval_preference_accuracy": 0.625, "eval_reward_margin": 0.5})
    assert [value(dpo.registry, name) for name in GAUGES] == [0.25, -0.125, 0.375, 0.75, 0.625]
    assert value(dpo.registry, "finetune_eval_loss") == 0.6
    dpo.preference_step({"step": 4, "loss": 0.5})  # an entry without the keys changes nothing
    dpo.evaluated({"eval_loss": None})
    assert [value(dpo.registry, name) for name in GAUGES] == [0.25, -0.125, 0.375, 0.75, 0.625]
    assert value(dpo.registry, "finetune_eval_loss") == 0.6


def test_the_help_texts_give_trls_definitions() -> None:
    registry = CollectorRegistry()
    ProgressMetrics(registry, {"rank": "0"})
    helps = {family.name: family.documentation for family in registry.collect()}
    for name in ("finetune_train_reward_chosen", "finetune_train_reward_rejected"):
        assert "beta x (policy - reference)" in helps[name] and "ORPO" in helps[name], helps[name]
    assert "0 to 1" in helps["finetune_train_preference_accuracy"]
    assert "held-out pairs" in helps["finetune_eval_preference_accuracy"]


def test_rank_0s_preference_gauges_reach_status_progress() -> None:
    metrics = ProgressMetrics(CollectorRegistry(), {"rank": "0"})
    metrics.global_step.set(3)
    metrics.preference_step(PREFERENCE_STEP)
    metrics.evaluated({"eval_loss": 0.6, "eval_preference_accuracy": 0.62345})
    progress = scraped(metrics)
    assert progress.preference_accuracy == 0.75 and progress.reward_margin == 0.375
    assert progress.rewards_chosen == 0.25 and progress.rewards_rejected == -0.125
    assert progress.eval_preference_accuracy == 0.6234
    wire = progress.to_wire()
    assert wire["preferenceAccuracy"] == 0.75 and wire["rewardMargin"] == 0.375
    assert wire["rewardsChosen"] == 0.25 and wire["rewardsRejected"] == -0.125
    assert wire["evalPreferenceAccuracy"] == 0.6234


def test_an_sft_jobs_progress_carries_none_of_the_preference_fields() -> None:
    metrics = ProgressMetrics(CollectorRegistry(), {"rank": "0"})
    metrics.global_step.set(3)
    metrics.preference_step(SFT_STEP)
    metrics.evaluated({"eval_loss": 1.25})
    metrics.loss.set(1.5)
    metrics.epoch.set(0.1)
    wire = scraped(metrics).to_wire()
    assert wire == {"step": 3, "epoch": 0.1, "loss": 1.5, "lastUpdateTime": "2026-11-29T12:00:00Z"}


def test_before_the_first_step_only_the_evaluation_is_known() -> None:
    metrics = ProgressMetrics(CollectorRegistry(), {"rank": "0"})
    metrics.evaluated({"eval_loss": 0.69, "eval_preference_accuracy": 0.5})  # the evaluation before step 1
    progress = scraped(metrics)
    assert progress.preference_accuracy is None and progress.rewards_chosen is None
    assert progress.eval_preference_accuracy == 0.5


def test_success_keeps_the_scraped_rewards_and_takes_the_final_evaluation_from_the_summary() -> None:
    job, _ = step(job_with(), [])
    scraped_progress = Progress(
        step=39, preference_accuracy=0.75, reward_margin=0.375, rewards_chosen=0.25, rewards_rejected=-0.125
    )
    job, _ = step(job, [pod(0), pod(1)], progress=scraped_progress.model_copy(update={"eval_preference_accuracy": 0.5}))
    summary = json.dumps({"finalLoss": 0.4, "steps": 40, "tokens": 100, "evalPreferenceAccuracy": 0.87654})
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    progress = decision.status.progress
    assert decision.status.state == "Succeeded" and progress is not None
    assert (progress.preference_accuracy, progress.reward_margin) == (0.75, 0.375)
    assert (progress.rewards_chosen, progress.rewards_rejected) == (0.25, -0.125)
    assert progress.eval_preference_accuracy == 0.8765
    assert progress.loss == 0.4 and progress.summary == "40/40 (100%)"


def test_an_sft_success_has_no_preference_fields_in_its_status() -> None:
    job, _ = step(job_with(), [])
    job, _ = step(job, [pod(0), pod(1)], progress=Progress(step=39, loss=0.5))
    summary = TrainingSummary(steps=40, tokens=100, final_loss=0.4, eval_loss=0.45).to_message()
    assert "evalPreferenceAccuracy" not in summary
    decision = run(job, [pod(0, last=exited(0, summary, "Completed")), pod(1, state={"terminated": exited(0)})])
    assert decision.status.progress is not None
    wire = decision.status.progress.to_wire()
    assert wire["loss"] == 0.4
    assert not {
        "preferenceAccuracy",
        "rewardMargin",
        "rewardsChosen",
        "rewardsRejected",
        "evalPreferenceAccuracy",
    } & set(wire)
