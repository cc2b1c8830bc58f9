"""The choice: the least sharding/offload that fits, the fastest of that tier, explained."""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.plan import DoesNotFitError, choose_plan, next_frugal_plan, plan_job
from finetune_operator.plan.search.candidates import frugality_tier
from finetune_operator.plan.search.planner import PlanResult

GIB = 2**30


def job_spec(
    arch: str = "llama-2-7b",
    method: str = "lora",
    *,
    nodes: int = 1,
    gpus: int = 8,
    memory: str = "80Gi",
    seq: int = 2048,
    host_memory: str | None = None,
    **extra: Any,
) -> Any:
    from tests.factories import make_job

    resources: dict[str, Any] = {"numNodes": nodes, "gpusPerNode": gpus, "gpuMemory": memory}
    if host_memory is not None:
        resources["memory"] = host_memory
    return make_job(
        model={"uri": "org/model", "architecture": arch},
        method={"type": method},
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": seq},
        resources=resources,
        **extra,
    ).spec


SCENARIOS = [
    ("llama-2-7b", "qlora", 1, 1, "24Gi"),
    ("llama-2-7b", "lora", 1, 1, "80Gi"),
    ("llama-2-7b", "full", 1, 8, "80Gi"),
    ("llama-3.1-8b", "full", 1, 8, "40Gi"),
    ("llama-3.1-70b", "lora", 1, 8, "80Gi"),
    ("llama-3.1-70b", "full", 4, 8, "80Gi"),
    ("mixtral-8x7b", "lora", 1, 8, "80Gi"),
    ("qwen2.5-72b", "qlora", 1, 4, "48Gi"),
    ("gemma-2-9b", "lora", 1, 2, "24Gi"),
    ("phi-3-mini", "full", 1, 1, "24Gi"),
    ("tiny-llama", "lora", 1, 0, "80Gi"),
]


@pytest.fixture(params=SCENARIOS, ids=lambda s: "-".join(map(str, s)))
def result(request: pytest.FixtureRequest) -> PlanResult:
    arch, method, nodes, gpus, memory = request.param
    return plan_job(job_spec(arch, method, nodes=nodes, gpus=gpus, memory=memory))


def test_chosen_plan_fits(result: PlanResult) -> None:
    assert result.chosen is not None and result.chosen.fits
    assert result.chosen.per_gpu_bytes <= result.gpu_budget_bytes < result.gpu_memory_bytes


def test_zero3_only_when_no_lower_stage_fits_and_offload_only_when_nothing_gpu_only_fits(result: PlanResult) -> None:
    chosen = result.chosen
    assert chosen is not None
    for candidate in result.candidates:
        if candidate.fits:
            assert frugality_tier(candidate.strategy) >= frugality_tier(chosen.strategy)
    if chosen.strategy.zero_stage == 3 and chosen.strategy.offload_optimizer == "none":
        assert not any(
            c.fits for c in result.candidates if c.strategy.zero_stage < 3 and c.strategy.offload_optimizer == "none"
        )
    if chosen.strategy.offload_optimizer != "none":
        assert not any(c.fits for c in result.candidates if c.strategy.offload_optimizer == "none")


def test_chosen_is_the_fastest_of_its_tier(result: PlanResult) -> None:
    chosen = result.chosen
    assert chosen is not None
    same_tier = [c for c in result.candidates if c.fits and c.tier == chosen.tier]
    assert chosen.step.seconds == min(c.step.seconds for c in same_tier)


def test_every_candidate_is_explained(result: PlanResult) -> None:
    for candidate in result.candidates:
        if not candidate.fits_gpu:
            assert candidate.reason.startswith("does not fit by ")
        elif candidate is result.chosen:
            assert candidate.reason.startswith("chosen")
        else:
            assert "slower by" in candidate.reason or "faster" in candidate.reason


def test_global_batch_is_kept(result: PlanResult) -> None:
    w = result.workload
    for c in result.candidates:
        assert c.strategy.micro_batch_size * c.strategy.gradient_accumulation_steps == w.per_rank_batch


def test_70b_example_yields_a_zero3_plan_that_fits() -> None:
    plan = choose_plan(job_spec("llama-3.1-70b", "lora", gpus=8))
    assert plan.zero_stage == 3 and plan.offload_optimizer == "none"
    assert plan.per_gpu_bytes <= 0.9 * 80 * GIB
    assert 1 <= len(plan.rejected) <= 16


def test_small_lora_job_does_not_shard() -> None:
    plan = choose_plan(job_spec("llama-2-7b", "lora", gpus=8))
    assert plan.zero_stage < 3 and plan.offload_optimizer == "none"


def test_pinned_choices_are_respected() -> None:
    spec = job_spec(
        "llama-2-7b",
        "lora",
        deepspeed={"zeroStage": 3, "offloadOptimizer": "cpu"},
        training={"microBatchSize": 2, "gradientCheckpointing": False},
    )
    result = plan_job(spec)
    assert {
        (c.strategy.zero_stage, c.strategy.offload_optimizer, c.strategy.micro_batch_size) for c in result.candidates
    } <= {(3, "cpu", 2)}
    assert all(not c.strategy.gradient_checkpointing for c in result.candidates)


def test_nothing_fits_says_what_would() -> None:
    with pytest.raises(DoesNotFitError) as caught:
        plan_job(job_spec("llama-3.1-8b", "full", gpus=1, memory="24Gi", deepspeed={"offloadOptimizer": "none"}))
    message = str(caught.value)
    assert message.startswith("nothing fits")
    assert "more GPUs" in message and "method.type: lora" in message
    assert "leave deepspeed.* and training.microBatchSize/gradientCheckpointing on auto" in message


def test_weights_larger_than_the_gpu_are_named() -> None:
    with pytest.raises(DoesNotFitError, match=r"the weights alone are 131\.\d GiB"):
        plan_job(job_spec("llama-3.1-70b", "lora", gpus=1, memory="40Gi", deepspeed={"zeroStage": 2}))


def test_host_memory_limits_offload() -> None:
    spec = job_spec("llama-3.1-8b", "full", gpus=1, memory="24Gi", host_memory="32Gi")
    with pytest.raises(DoesNotFitError, match="more host memory"):
        plan_job(spec)


def test_gpu_memory_override() -> None:
    small = plan_job(job_spec("llama-2-7b", "lora", gpus=1), gpu_memory_bytes=24 * GIB)
    assert small.gpu_memory_bytes == 24 * GIB and small.chosen is not None
    assert small.chosen.per_gpu_bytes <= 0.9 * 24 * GIB


def test_replan_sequence_is_strictly_more_frugal_and_ends() -> None:
    spec = job_spec("llama-3.1-8b", "full", gpus=8, memory="80Gi")
    plan = choose_plan(spec)
    seen = [plan.per_gpu_bytes]
    for _ in range(200):
        following = next_frugal_plan(spec, plan, reason="CUDA out of memory on rank 3")
        if following is None:
            break
        assert following.per_gpu_bytes < plan.per_gpu_bytes
        assert following.replans == plan.replans + 1
        assert following.replan_reason == "CUDA out of memory on rank 3"
        plan = following
        seen.append(plan.per_gpu_bytes)
    else:
        pytest.fail("the re-planning sequence never ended")
    assert len(seen) >= 4


def test_replan_follows_the_design_ladder() -> None:
    spec = job_spec("llama-3.1-8b", "full", gpus=8, memory="80Gi", training={"gradientCheckpointing": True})
    plan = choose_plan(spec)
    rungs = [(plan.zero_stage, plan.offload_optimizer, plan.offload_params)]
    while (following := next_frugal_plan(spec, plan)) is not None:
        plan = following
        rung = (plan.zero_stage, plan.offload_optimizer, plan.offload_params)
        if rung != rungs[-1]:
            rungs.append(rung)
    assert rungs[-3:] == [(3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu")]


def test_replan_respects_pins() -> None:
    spec = job_spec("llama-2-7b", "lora", gpus=8, deepspeed={"zeroStage": 2, "offloadOptimizer": "none"})
    plan = choose_plan(spec)
    while (following := next_frugal_plan(spec, plan)) is not None:
        assert following.zero_stage == 2 and following.offload_optimizer == "none"
        plan = following


def test_json_has_exactly_the_documented_keys() -> None:
    data = plan_job(job_spec()).to_json()
    assert set(data) == {"chosen", "candidates", "gpuMemoryBytes"}
    chosen_keys = {
        "zeroStage",
        "offloadOptimizer",
        "offloadParams",
        "gradientCheckpointing",
        "microBatchSize",
        "gradientAccumulationSteps",
        "perGpuBytes",
        "breakdown",
        "hostBytesPerNode",
        "estimatedStepSeconds",
    }
    assert set(data["chosen"]) == chosen_keys
    assert all(set(c) == chosen_keys | {"fits", "reason"} for c in data["candidates"])
    assert set(data["chosen"]["breakdown"]) == {
        "weights",
        "trainableWeights",
        "gradients",
        "optimizerStates",
        "activations",
        "logits",
        "buffers",
        "overhead",
    }


def test_a_70b_full_fine_tuning_job_on_four_nodes_gets_a_plan() -> None:
    """How long planning it takes is measured by benchmarks/planner_speed.py, not here."""
    result = plan_job(job_spec("llama-3.1-70b", "full", nodes=4, gpus=8))
    assert result.chosen is not None


def test_lora_dropout_on_fused_experts_is_zero_by_default_and_refused_when_set() -> None:
    from finetune_operator.plan.errors import UnsupportedSettingError
    from finetune_operator.plan.workload import workload_from_spec
    from tests.factories import make_job

    def mixtral(**lora: Any) -> Any:
        return make_job(
            model={"uri": "org/model", "architecture": "mixtral-8x7b"},
            method={"type": "lora", "lora": lora},
            resources={"numNodes": 1, "gpusPerNode": 8, "gpuMemory": "80Gi"},
        ).spec

    assert workload_from_spec(mixtral()).lora_dropout == 0.0
    assert workload_from_spec(mixtral(dropout=0.0)).lora_dropout == 0.0
    assert workload_from_spec(mixtral(dropout=0.1, targetModules=["q_proj", "v_proj"])).lora_dropout == 0.1
    assert workload_from_spec(job_spec("llama-2-7b", "lora", nodes=1, gpus=1, memory="80Gi")).lora_dropout == 0.05
    with pytest.raises(UnsupportedSettingError) as caught:
        plan_job(mixtral(dropout=0.05))
    assert caught.value.condition_reason == "InvalidSpec"
    assert str(caught.value).startswith("spec.method.lora.dropout: 0.05 cannot apply to mixtral-8x7b")
