"""One strategy type from the planner to `status.plan` to a checkpoint's record, with one text form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from finetune_operator.api.pod_contract import CheckpointState
from finetune_operator.api.status import PlanStatus
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan.search.planner import candidate_json, plan_job
from tests.factories import make_job

RECORDED_STRATEGY: dict[str, Any] = {
    "zeroStage": 3,
    "offloadOptimizer": "cpu",
    "offloadParams": "none",
    "microBatchSize": 2,
    "gradientAccumulationSteps": 2,
    "worldSize": 2,
}
RECORDED_CHECKPOINT: dict[str, Any] = {
    "globalStep": 6,
    "tokens": 1536,
    "samples": 24,
    "lastLoss": 1.25,
    "strategy": RECORDED_STRATEGY,
    "checkpointFormat": "deepspeed",
}
"""`trainer_state.json` as trainers wrote it before the strategy recorded gradient checkpointing."""

RECORDED_PLAN = {
    "zeroStage": 3,
    "offloadOptimizer": "cpu",
    "offloadParams": "none",
    "gradientCheckpointing": True,
    "microBatchSize": 2,
    "gradientAccumulationSteps": 2,
    "perGpuBytes": 1000,
    "gpuMemoryBytes": 2000,
    "reason": "ZeRO-3 opt→cpu mb=2×2 ckpt fits",
}
"""A `status.plan` as the operator wrote it."""


def test_a_checkpoint_recorded_before_gradient_checkpointing_was_kept_loads_and_matches_its_plan() -> None:
    state = CheckpointState.from_file(json.dumps(RECORDED_CHECKPOINT))
    saved = state.strategy
    assert saved is not None and not saved.gradient_checkpointing
    now = Strategy.from_plan(PlanStatus.from_wire(RECORDED_PLAN), world_size=2)
    assert now.gradient_checkpointing
    # checkpointing trades compute for memory: it changes no checkpoint layout, so this is no re-plan
    assert saved.changes(now) == []
    assert saved.global_batch == now.global_batch == 8
    assert saved.changes(now.model_copy(update={"world_size": 1})) == ["worldSize: 2 -> 1"]
    written = json.loads(CheckpointState(global_step=6, strategy=now).to_file())["strategy"]
    assert written == {**RECORDED_STRATEGY, "gradientCheckpointing": True}


def test_the_text_form_names_only_what_is_there() -> None:
    plain = Strategy(zero_stage=0, micro_batch_size=8, gradient_accumulation_steps=1)
    assert str(plain) == "ZeRO-0, micro-batch 8 x accumulation 1"
    frugal = plain.model_copy(
        update={
            "zero_stage": 3,
            "offload_optimizer": "nvme",
            "offload_params": "cpu",
            "gradient_checkpointing": True,
            "world_size": 4,
        }
    )
    assert str(frugal) == (
        "ZeRO-3, optimizer offload nvme, parameter offload cpu, micro-batch 8 x accumulation 1 x world 4, "
        "gradient checkpointing"
    )


def test_status_plan_keeps_its_wire_fields_and_its_text_is_the_strategys() -> None:
    result = plan_job(make_job().spec, gpu_memory_bytes=80 * 2**30)
    assert result.chosen is not None
    status = result.to_status()
    wire = status.to_wire()
    strategy_keys = set(RECORDED_STRATEGY) - {"worldSize"} | {"gradientCheckpointing"}
    assert strategy_keys <= set(wire) and "worldSize" not in wire
    assert Strategy.from_plan(PlanStatus.from_wire(wire)) == result.chosen.strategy
    assert status.reason.startswith(f"{result.chosen.strategy} fits: ")
    assert status.rejected and all(", micro-batch " in r.summary for r in status.rejected)
    as_json = candidate_json(result.chosen, with_verdict=False)
    assert list(as_json)[:6] == [
        "zeroStage",
        "offloadOptimizer",
        "offloadParams",
        "gradientCheckpointing",
        "microBatchSize",
        "gradientAccumulationSteps",
    ]
    assert set(as_json["breakdown"]) == {
        "weights",
        "trainableWeights",
        "gradients",
        "optimizerStates",
        "activations",
        "logits",
        "buffers",
        "overhead",
    }


def test_a_bad_offload_names_the_field_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"offloadParams[\s\S]*none\|cpu\|nvme"):
        Strategy.from_wire({**RECORDED_STRATEGY, "offloadParams": "disk"})
