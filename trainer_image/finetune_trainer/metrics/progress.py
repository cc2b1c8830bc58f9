"""Training-progress metrics of one rank (names and conventions from docs/METRICS.md).

Each rank owns a private registry so that several ranks in one process (tests) or one
pod never collide, and memory or communication collectors can be registered next to
these ones later (see `exporter.serve`). Gauges are used for values that resume
(step, epoch); counters restart at 0 with the process, as Prometheus counters do.

The preference series (DPO, ORPO) start at NaN, not 0: an SFT job has no rewards, and a 0
would read as "every pair lost"; the operator's scrape and the dashboards treat NaN as unknown,
and the series exist from the start all the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)

_REWARD = (
    "TRL's definition: beta x (policy - reference) log-probability of the completion for DPO, "
    "beta x the policy's mean log-probability per completion token for ORPO"
)
PREFERENCE_GAUGES = {
    "rewards_chosen": (
        "finetune_train_reward_chosen",
        f"Mean reward of the chosen completions over the last step's pairs ({_REWARD}); NaN: no preference objective.",
    ),
    "rewards_rejected": (
        "finetune_train_reward_rejected",
        f"Mean reward of the rejected completions over the last step's pairs ({_REWARD}); NaN: no preference "
        "objective.",
    ),
    "reward_margin": (
        "finetune_train_reward_margin",
        "Mean of chosen minus rejected reward over the last step's pairs (TRL's rewards/margins); NaN: no "
        "preference objective.",
    ),
    "preference_accuracy": (
        "finetune_train_preference_accuracy",
        "Share of the last step's pairs whose chosen reward beats the rejected one (TRL's rewards/accuracies, "
        "0 to 1); NaN: no preference objective.",
    ),
}
"""Train-log key of a preference step → (gauge name, help)."""


class ProgressMetrics:
    """The `finetune_train_*` and checkpoint series of one rank."""

    def __init__(self, registry: CollectorRegistry, info: dict[str, str]) -> None:
        self.registry = registry
        self.info = Gauge(
            "finetune_trainer_info",
            "Static facts about this rank (value 1); UUID is the GPU UUID or empty on CPU.",
            list(info),
            registry=registry,
        )
        self.info.labels(**info).set(1)
        self.global_step = Gauge("finetune_train_global_step", "Optimizer steps done (resumes).", registry=registry)
        self.max_steps = Gauge("finetune_train_max_steps", "Optimizer steps planned for the run.", registry=registry)
        self.epoch = Gauge("finetune_train_epoch", "Fractional epoch of the data stream.", registry=registry)
        self.loss = Gauge(
            "finetune_train_loss",
            "Training loss of the last step: the mean over every predicted token of the global batch.",
            registry=registry,
        )
        self.learning_rate = Gauge("finetune_train_learning_rate", "Learning rate of the last step.", registry=registry)
        self.grad_norm = Gauge(
            "finetune_train_grad_norm", "Global gradient norm before clipping of the last step.", registry=registry
        )
        self.steps = Counter("finetune_train_steps", "Optimizer steps done by this process.", registry=registry)
        self.samples = Counter("finetune_train_samples", "Samples this rank trained on.", registry=registry)
        self.tokens = Counter("finetune_train_tokens", "Non-padding tokens this rank trained on.", registry=registry)
        self.model_flops = Counter(
            "finetune_train_model_flops",
            "Model FLOPs of this rank by the 6 * tokens * parameters convention (attention not counted).",
            registry=registry,
        )
        self.step_duration = Histogram(
            "finetune_train_step_duration_seconds",
            "Wall clock per optimizer step.",
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.dataloader_wait = Histogram(
            "finetune_train_dataloader_wait_seconds",
            "Time a step waited for its batches.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.last_step = Gauge(
            "finetune_train_last_step_timestamp_seconds", "Unix time of the last finished step.", registry=registry
        )
        self.checkpoint_success = Gauge(
            "finetune_checkpoint_last_success_timestamp_seconds",
            "Unix time of the last complete checkpoint.",
            registry=registry,
        )
        self.checkpoint_duration = Histogram(
            "finetune_checkpoint_save_duration_seconds",
            "Wall clock of a checkpoint save, rename included.",
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.eval_loss = Gauge("finetune_eval_loss", "Validation loss of the last evaluation.", registry=registry)
        self.preference = {
            key: Gauge(name, help_text, registry=registry) for key, (name, help_text) in PREFERENCE_GAUGES.items()
        }
        self.eval_preference_accuracy = Gauge(
            "finetune_eval_preference_accuracy",
            "Share of the held-out pairs whose chosen reward beats the rejected one at the last evaluation "
            "(TRL's eval rewards/accuracies, 0 to 1); NaN: no preference objective.",
            registry=registry,
        )
        for gauge in (*self.preference.values(), self.eval_preference_accuracy):
            gauge.set(float("nan"))
        self.resumed_step = Gauge(
            "finetune_checkpoint_resumed_step",
            "Step of the checkpoint this run resumed from (0: a fresh start).",
            registry=registry,
        )
        self.resume_converted = Gauge(
            "finetune_checkpoint_resume_converted",
            "1 when that checkpoint was written under another strategy (ZeRO stage, offload, micro-batch, "
            "accumulation or world size) and converted to this run's.",
            registry=registry,
        )

    def step_done(
        self,
        *,
        step: int,
        epoch: float,
        loss: float,
        lr: float,
        grad_norm: float | None,
        samples: int,
        tokens: int,
        seconds: float,
        wait_seconds: float,
        model_params: int,
    ) -> None:
        self.global_step.set(step)
        self.epoch.set(epoch)
        self.loss.set(loss)
        self.learning_rate.set(lr)
        if grad_norm is not None:
            self.grad_norm.set(grad_norm)
        self.steps.inc()
        self.samples.inc(samples)
        self.tokens.inc(tokens)
        self.model_flops.inc(6 * tokens * model_params)
        self.step_duration.observe(seconds)
        self.dataloader_wait.observe(wait_seconds)
        self.last_step.set(time.time())

    def preference_step(self, entry: Mapping[str, Any]) -> None:
        """A step's train-log entry: the rewards and accuracy of a preference objective, when it has them."""
        for key, gauge in self.preference.items():
            if key in entry:
                gauge.set(entry[key])

    def evaluated(self, result: Mapping[str, Any]) -> None:
        """An evaluation's result: its loss, and the pairs' accuracy of a preference objective."""
        if result.get("eval_loss") is not None:
            self.eval_loss.set(result["eval_loss"])
        if result.get("eval_preference_accuracy") is not None:
            self.eval_preference_accuracy.set(result["eval_preference_accuracy"])

    def resumed(self, step: int, converted: bool) -> None:
        """This run continues from the step-`step` checkpoint (the operator turns it into an Event)."""
        self.resumed_step.set(step)
        self.resume_converted.set(1 if converted else 0)

    def checkpoint_done(self, seconds: float) -> None:
        self.checkpoint_duration.observe(seconds)
        self.checkpoint_success.set(time.time())
