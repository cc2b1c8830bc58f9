"""The weight groups a job's LoRA adapts, resolved once into its `Workload`.

Every memory term that depends on what LoRA adapts (the inputs and masks kept for backward, the
materialised expert weights, the adapter matrices ZeRO-3 keeps whole) reads `Workload.adapted`,
so it must follow the method, the rank and the targets through every way a workload is made.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from finetune_operator.api.methods import MethodType
from finetune_operator.plan.search.memory import persistent_adapter_params
from finetune_operator.plan.workload import Workload, workload_from_spec
from tests.factories import make_job


def workload(arch: str, method: dict[str, Any]) -> Workload:
    job = make_job(
        model={"uri": "org/model", "architecture": arch},
        method=method,
        dataset={"uri": "builtin://reverse-words", "maxSeqLength": 512},
    )
    return workload_from_spec(job.spec)


def ranks(w: Workload) -> dict[tuple[str, str], int]:
    return {(a.group.name, a.group.kind): a.rank for a in w.adapted}


def test_the_targets_and_rank_of_the_spec_are_what_is_adapted() -> None:
    w = workload("llama-2-7b", {"type": "lora", "lora": {"r": 8, "targetModules": ["q_proj", "v_proj"]}})
    assert w.method is MethodType.LORA
    assert ranks(w) == {("q_proj", "linear"): 8, ("v_proj", "linear"): 8}
    assert not w.adapts_experts


def test_fused_gate_up_experts_get_twice_the_rank_and_count_as_adapted_experts() -> None:
    w = workload("mixtral-8x7b", {"type": "qlora", "lora": {"r": 4, "dropout": 0.0}})
    assert ranks(w)[("gate_up_proj", "experts")] == 8
    assert ranks(w)[("down_proj", "experts")] == 4
    assert ranks(w)[("gate", "router")] == 4
    assert w.adapts_experts


def test_full_fine_tuning_adapts_nothing() -> None:
    w = workload("mixtral-8x7b", {"type": "full"})
    assert w.adapted == ()
    assert not w.adapts_experts
    assert persistent_adapter_params(w) == 0


def test_another_method_resolves_the_adapted_groups_again() -> None:
    lora = workload("mixtral-8x7b", {"type": "lora", "lora": {"dropout": 0.0}})
    full = lora.with_method(MethodType.FULL)
    assert full.adapted == ()
    assert lora.with_method(MethodType.QLORA).adapted == lora.adapted
    assert full.with_method(MethodType.LORA).adapted == lora.adapted


def test_a_replaced_workload_resolves_its_own_adapted_groups() -> None:
    w = workload("llama-2-7b", {"type": "lora", "lora": {"r": 8}})
    narrower = dataclasses.replace(w, target_modules=("q_proj", "v_proj"), lora_r=2)
    assert ranks(narrower) == {("q_proj", "linear"): 2, ("v_proj", "linear"): 2}
    assert persistent_adapter_params(narrower) < persistent_adapter_params(w)
