"""The planner counts preference tuning: a pair is two sequences through one forward, full
fine-tuning DPO holds a frozen copy of the model beside the policy unless its reference is
precomputed, and the adapter methods' reference (the base with the adapter off) costs no
weights. SFT is untouched (the snapshot of 1,178 plans is byte-identical; see the closing note)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_operator.api import FineTuneJob
from finetune_operator.api.methods import ReferenceModel
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan import plan_job
from finetune_operator.plan.search.activations import activation_bytes
from finetune_operator.plan.search.memory import estimate_memory, reference_weight_bytes
from finetune_operator.plan.workload import Workload, workload_from_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lora-8b-2x8.yaml"


def job(method: str, objective: str | None, precompute: bool | None = None, adapter: str | None = None) -> FineTuneJob:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    spec = doc["spec"]
    if adapter is not None:
        spec["model"]["adapter"] = adapter
    spec["method"] = {"type": method}
    if objective is not None:  # a preference objective adapts the weights as preference.base says
        spec["method"] = {"type": objective, "preference": {"base": method}}
        spec["dataset"]["format"] = "preference"
        spec["dataset"].pop("packing", None)
    if precompute is not None:
        spec["method"]["preference"] = {**spec["method"].get("preference", {}), "precomputeReference": precompute}
    return FineTuneJob.from_wire(doc)


def workload(method: str, objective: str | None, precompute: bool | None = None) -> Workload:
    return workload_from_spec(job(method, objective, precompute).spec)


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
@pytest.mark.parametrize("objective", ["dpo", "orpo"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_pair_costs_the_activations_of_two_sequences(method: str, objective: str, checkpointing: bool) -> None:
    sft, preference = workload(method, None), workload(method, objective)
    assert preference.sequences_per_step_example == 2 and sft.sequences_per_step_example == 1
    for micro in (1, 2, 4):
        assert activation_bytes(preference, micro, checkpointing) == activation_bytes(sft, 2 * micro, checkpointing)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_full_dpo_holds_a_frozen_copy_unless_the_reference_is_precomputed(stage: int) -> None:
    strategy = Strategy(zero_stage=stage, micro_batch_size=1, gradient_accumulation_steps=1)
    sft, copy_, precomputed = workload("full", None), workload("full", "dpo"), workload("full", "dpo", True)
    assert (copy_.reference, precomputed.reference) == (ReferenceModel.FROZEN_COPY, ReferenceModel.PRECOMPUTED)
    whole_model = (sft.counts.trainable + sft.counts.frozen) * sft.param_bytes
    assert reference_weight_bytes(copy_) == whole_model and reference_weight_bytes(precomputed) == 0
    shard = sft.world_size if stage == 3 else 1
    extra = estimate_memory(copy_, strategy).breakdown["weights"] - estimate_memory(sft, strategy).breakdown["weights"]
    assert extra == pytest.approx(whole_model / shard, abs=1)
    same = (
        estimate_memory(precomputed, strategy).breakdown["weights"]
        - estimate_memory(sft, strategy).breakdown["weights"]
    )
    assert same == 0


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_an_adapter_methods_reference_is_its_own_base(method: str) -> None:
    dpo, sft = workload(method, "dpo"), workload(method, None)
    assert dpo.reference is ReferenceModel.ADAPTER_DISABLED and reference_weight_bytes(dpo) == 0
    strategy = Strategy(zero_stage=2, micro_batch_size=1, gradient_accumulation_steps=1)
    assert estimate_memory(dpo, strategy).breakdown["weights"] == estimate_memory(sft, strategy).breakdown["weights"]


def test_a_dpo_plan_needs_more_per_gpu_than_the_same_sft_plan() -> None:
    sft = plan_job(job("lora", None).spec, require_fit=False)
    dpo = plan_job(job("lora", "dpo").spec, require_fit=False)
    chosen_sft, chosen_dpo = sft.chosen or sft.candidates[0], dpo.chosen or dpo.candidates[0]
    assert chosen_dpo.per_gpu_bytes > chosen_sft.per_gpu_bytes or (
        chosen_dpo.strategy.micro_batch_size < chosen_sft.strategy.micro_batch_size
    )


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_advice_for_a_preference_job_names_the_field_that_sets_its_adaptation(objective: str) -> None:
    """A full-model preference job that does not fit is told to change `method.preference.base`
    (its `method.type` is the objective); an SFT job keeps `method.type`."""
    from finetune_operator.plan.search.planner import plan_job

    def one_gpu(method: str, objective: str | None) -> Any:
        doc = job(method, objective).to_wire()
        doc["spec"]["resources"] = {**doc["spec"]["resources"], "numNodes": 1, "gpusPerNode": 1}
        doc["spec"]["deepspeed"] = {"offloadOptimizer": "none"}
        doc["spec"]["resources"].pop("gpuMemory", None)
        return FineTuneJob.from_wire(doc).spec

    sft = plan_job(one_gpu("full", None), gpu_memory_bytes=24 * 2**30, require_fit=False)
    preference = plan_job(one_gpu("full", objective), gpu_memory_bytes=24 * 2**30, require_fit=False)
    assert any(line.startswith("method.type: lora would fit") for line in sft.suggestions), sft.suggestions
    assert any(line.startswith("method.preference.base: lora would fit") for line in preference.suggestions), (
        preference.suggestions
    )
    assert not any(line.startswith("method.type:") for line in preference.suggestions), preference.suggestions


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("stage", [2, 3])
def test_a_preference_job_that_starts_from_an_adapter_counts_that_adapter_frozen_beside_it(
    method: str, stage: int
) -> None:
    dpo, from_adapter = (
        workload(method, "dpo"),
        workload_from_spec(job(method, "dpo", adapter="/runs/sft/adapter").spec),
    )
    assert from_adapter.reference is ReferenceModel.START_ADAPTER
    assert reference_weight_bytes(from_adapter) == 4 * dpo.counts.trainable > 0
    strategy = Strategy(zero_stage=stage, micro_batch_size=1, gradient_accumulation_steps=1)
    shard = dpo.world_size if stage == 3 else 1
    extra = (
        estimate_memory(from_adapter, strategy).breakdown["weights"]
        - estimate_memory(dpo, strategy).breakdown["weights"]
    )
    assert extra == pytest.approx(4 * dpo.counts.trainable / shard, abs=1)
    # SFT from an adapter has no reference: the adapter it loads is the one it trains
    sft = workload_from_spec(job(method, None, adapter="/runs/sft/adapter").spec)
    assert sft.reference is ReferenceModel.NONE and reference_weight_bytes(sft) == 0
