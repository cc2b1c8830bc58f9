"""The observed state of a FineTuneJob, written only by the operator.

Conditions follow the Kubernetes API conventions. `state` is a one-word summary
derived from the conditions (never stored independently) so that `kubectl get ftj`
can show it; everything else mirrors what the operator planned and observed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import ApiModel
from .reasons import State
from .serving import ServingStatus
from .strategy import StrategyFields
from .tracking import TrackingResult


class Condition(ApiModel):
    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: Annotated[str, Field(pattern=r"^(True|False|Unknown)$")]
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    message: Annotated[str, Field(max_length=32768)] = ""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class MemoryBreakdown(ApiModel):
    """Bytes per GPU by component (the planner's keys)."""

    weights: int = 0
    trainable_weights: int = 0
    gradients: int = 0
    optimizer_states: int = 0
    activations: int = 0
    logits: int = 0
    buffers: int = 0
    overhead: int = 0


class RejectedCandidate(ApiModel):
    summary: Annotated[str, Field(max_length=256)]
    reason: Annotated[str, Field(max_length=1024)]


class PlanStatus(StrategyFields):
    """The strategy in force, why it was chosen, and what was rejected."""

    per_gpu_bytes: Annotated[int, Field(ge=0)]
    gpu_memory_bytes: Annotated[int, Field(ge=0)]
    host_bytes_per_node: Annotated[int, Field(ge=0)] = 0
    estimated_step_seconds: float | None = None
    breakdown: MemoryBreakdown = Field(default_factory=MemoryBreakdown)
    reason: Annotated[str, Field(max_length=2048)] = ""
    rejected: Annotated[list[RejectedCandidate], Field(max_length=16)] = Field(default_factory=list)
    candidate_index: Annotated[int, Field(ge=0)] = 0
    replans: Annotated[int, Field(ge=0)] = 0
    replan_reason: Annotated[str, Field(max_length=2048)] | None = None
    trainable_parameters: Annotated[int, Field(ge=0)] | None = None
    """What trains, counted by the planner: the rendered DeepSpeed buckets are sized to it."""
    model_bytes: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Bytes of the model's files a pod downloads (the hub's listing, the claim's files, or the "
        "catalogue's parameters × dtype): each pod's model cache claim is sized from it.",
    )


class Progress(ApiModel):
    step: Annotated[int, Field(ge=0)] = 0
    total_steps: Annotated[int, Field(ge=0)] | None = None
    epoch: float | None = None
    loss: float | None = None
    preference_accuracy: float | None = Field(
        default=None,
        description="Preference objectives (DPO, ORPO): share of the latest step's pairs whose chosen reward "
        "beats the rejected one (TRL's rewards/accuracies).",
    )
    reward_margin: float | None = Field(
        default=None, description="Preference objectives: mean chosen minus rejected reward of the latest step."
    )
    rewards_chosen: float | None = Field(
        default=None,
        description="Preference objectives: mean reward of the latest step's chosen completions (DPO: beta x "
        "(policy - reference) log-probability; ORPO: beta x the policy's mean log-probability per token).",
    )
    rewards_rejected: float | None = Field(
        default=None, description="Preference objectives: mean reward of the latest step's rejected completions."
    )
    eval_preference_accuracy: float | None = Field(
        default=None, description="Preference objectives: the held-out pairs' accuracy at the latest evaluation."
    )
    tokens_per_second: float | None = None
    eta_seconds: Annotated[int, Field(ge=0)] | None = None
    percent: Annotated[int, Field(ge=0, le=100)] | None = None
    summary: Annotated[str, Field(max_length=64)] | None = None
    skipped_records: Annotated[int, Field(ge=0)] | None = None
    resumed_from_step: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Step of the checkpoint the running gang resumed from (unset: a fresh start)."
    )
    checkpoint_converted: bool | None = Field(
        default=None,
        description="True when that checkpoint was written under another strategy and converted to the plan's.",
    )
    checkpoint_save_seconds: Annotated[float, Field(ge=0)] | None = Field(
        default=None,
        description="Mean wall clock of a checkpoint save as rank 0 measured it (kept across restarts): the "
        "trainer pods' terminationGracePeriodSeconds is sized from it once known, from the plan before.",
    )
    last_update_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None


class Workers(ApiModel):
    ready: Annotated[int, Field(ge=0)] = 0
    total: Annotated[int, Field(ge=0)] = 0
    summary: Annotated[str, Field(max_length=32)] | None = None


class Result(ApiModel):
    adapter_uri: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None,
        description="The trained adapter (lora, qlora; dpo/orpo on them): `pvc://claim/path` or `s3://bucket/key`, "
        "what a serving runtime or another job's `model.adapter` takes (`file:///path` only for a path output or "
        "`ftjob run`).",
    )
    model_uri: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="The trained model of a full fine-tune, in the same URI forms as adapterUri."
    )
    merged_model_uri: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None,
        description="Base and adapter merged (`output.mergedModel`), in the same URI forms as adapterUri: a model "
        "any runtime serves without LoRA support.",
    )
    final_loss: float | None = None
    eval_loss: float | None = None
    eval_loss_before: float | None = None
    exact_match: float | None = None
    exact_match_before: float | None = None
    skipped_records: Annotated[int, Field(ge=0)] | None = None
    steps: Annotated[int, Field(ge=0)] | None = None
    tokens: Annotated[int, Field(ge=0)] | None = None
    trained_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Tokens the loss was taken over (the responses), summed over all steps."
    )
    wall_seconds: float | None = None
    tracking: TrackingResult | None = Field(
        default=None,
        description="The job's MLflow run (id, URL) and TensorBoard folder; set while running once rank 0 reports it.",
    )


class LastFailure(ApiModel):
    reason: Annotated[str, Field(max_length=128)]
    message: Annotated[str, Field(max_length=4096)] = ""
    rank: int | None = None
    exit_code: int | None = None
    time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    fingerprint: Annotated[str, Field(max_length=256)] | None = Field(
        default=None, description="Identifies the failed container run, so one failure is counted once."
    )


class FineTuneJobStatus(ApiModel):
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    state: State | None = None
    topology: Annotated[str, Field(max_length=32)] | None = None
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list, json_schema_extra={"x-ftjob-list-map-keys": ["type"]}
    )
    plan: PlanStatus | None = None
    progress: Progress | None = None
    restarts: Annotated[int, Field(ge=0)] = 0
    evictions: Annotated[int, Field(ge=0)] = Field(
        default=0, description="Times Kueue evicted (preempted) the admitted gang; not counted as restarts."
    )
    preemptions: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="Times the gang was stopped to make room (a Kueue eviction, or ranks that stopped on SIGTERM "
        "after saving a checkpoint: a pod eviction, a node drain, a spot reclaim); never counted as restarts, "
        "never against failurePolicy.backoffLimit.",
    )
    last_failure: LastFailure | None = None
    last_preemption: LastFailure | None = Field(
        default=None, description="The last stop of the gang on SIGTERM that its ranks reported as Preempted."
    )
    workers: Workers | None = None
    result: Result | None = None
    serving: ServingStatus | None = Field(
        default=None, description="What serves the result (spec.serving), applied after success."
    )
    start_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
    completion_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = None
