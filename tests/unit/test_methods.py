"""One descriptor per training method (api.methods): the planner, renderers and policies read its
traits, and none of them branches on a method's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune_operator.api.methods import (
    METHODS,
    OBJECTIVES,
    MethodTraits,
    MethodType,
    Objective,
    ObjectiveTraits,
    ReferenceModel,
    TrainingMethod,
    method_traits,
    objective_of,
    objective_traits,
    reference_model,
)
from finetune_operator.api.spec import MethodSpec, PreferenceSpec

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "operator" / "finetune_operator"
TRAINER = REPO / "trainer_image" / "finetune_trainer"
NAMED = re.compile(r"MethodType\.(LORA|QLORA|FULL)\b")
MAY_NAME = {
    "api/methods.py": "the table itself",
    "api/spec.py": "the CRD's per-type rules (CEL compares type names; their checks mirror them)",
}


def test_every_method_the_api_accepts_has_its_traits() -> None:
    assert set(METHODS) == set(MethodType)
    assert all(isinstance(t, MethodTraits) for t in METHODS.values())


@pytest.mark.parametrize("method", list(MethodType))
def test_traits_are_consistent(method: MethodType) -> None:
    traits = method_traits(method)
    assert traits is method_traits(str(method)) is MethodSpec(type=TrainingMethod(method)).traits
    assert traits.has_adapter is not traits.base_trains
    assert not (traits.base_quantized and traits.base_trains)  # a quantized base is frozen
    assert method not in traits.lighter and set(traits.lighter) <= set(METHODS)


def test_supervised_methods_are_what_they_were() -> None:
    lora, qlora, full = (method_traits(m) for m in (MethodType.LORA, MethodType.QLORA, MethodType.FULL))
    assert (lora.base_trains, lora.base_quantized, lora.has_adapter) == (False, False, True)
    assert (qlora.base_trains, qlora.base_quantized, qlora.has_adapter) == (False, True, True)
    assert (full.base_trains, full.base_quantized, full.has_adapter) == (True, False, False)
    assert full.lighter == (MethodType.LORA, MethodType.QLORA) and lora.lighter == (MethodType.QLORA,)
    assert qlora.lighter == ()


def test_every_objective_the_api_accepts_has_its_traits() -> None:
    assert set(OBJECTIVES) == set(Objective)
    assert {objective_of(m) for m in TrainingMethod} == set(Objective)
    assert all(isinstance(t, ObjectiveTraits) for t in OBJECTIVES.values())
    for objective, traits in OBJECTIVES.items():
        kind = TrainingMethod.LORA if objective == Objective.SFT else TrainingMethod(objective)
        assert traits is objective_traits(str(objective)) is MethodSpec(type=kind).objective_traits
        assert traits.sequences_per_example == (2 if traits.preference else 1)
        assert not traits.needs_reference or traits.preference  # only a preference objective has a reference


def test_supervised_fine_tuning_is_what_it_was() -> None:
    sft = objective_traits(Objective.SFT)
    assert (sft.preference, sft.sequences_per_example, sft.needs_reference) == (False, 1, False)
    assert {MethodSpec(type=TrainingMethod(m)).reference for m in MethodType} == {ReferenceModel.NONE}


@pytest.mark.parametrize("method", list(MethodType))
@pytest.mark.parametrize("objective", list(Objective))
@pytest.mark.parametrize("precompute", [False, True])
def test_the_reference_model_of_each_method_and_objective(
    method: MethodType, objective: Objective, precompute: bool
) -> None:
    """DPO compares against a reference: an adapter method's own base with the adapter off (no
    extra weights); full fine-tuning a frozen copy, or log-probabilities computed beforehand.
    SFT and ORPO have none."""
    found = reference_model(method, objective, precompute)
    if objective != Objective.DPO:
        assert found is ReferenceModel.NONE
    elif method_traits(method).has_adapter:
        assert found is ReferenceModel.ADAPTER_DISABLED
    else:
        assert found is (ReferenceModel.PRECOMPUTED if precompute else ReferenceModel.FROZEN_COPY)


@pytest.mark.parametrize("root", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_no_module_branches_on_a_method_name(root: Path) -> None:
    """The operator and the trainer read the traits: a new method is a row in api.methods (and a
    trainer module for what is its own), not a branch wherever lora, qlora or full differ."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if root == OPERATOR and rel in MAY_NAME:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NAMED.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "read api.methods' traits instead:\n" + "\n".join(found)


@pytest.mark.parametrize("kind", [TrainingMethod.DPO, TrainingMethod.ORPO])
@pytest.mark.parametrize("base", [None, *MethodType])
def test_a_preference_method_adapts_its_weights_as_its_base_says(kind: TrainingMethod, base: MethodType | None) -> None:
    """`method.type: dpo|orpo` is the objective; `preference.base` (lora when unset) the adaptation,
    and the traits, the reference and the objective follow from the two."""
    spec = MethodSpec(type=kind, preference=PreferenceSpec(base=base) if base else None)
    adaptation = base or MethodType.LORA
    assert spec.adaptation == adaptation
    assert spec.traits is method_traits(adaptation)
    assert spec.objective == Objective(kind)
    assert spec.reference == reference_model(adaptation, Objective(kind))
    assert spec.objective_traits.sequences_per_example == 2


@pytest.mark.parametrize("kind", [TrainingMethod.LORA, TrainingMethod.QLORA, TrainingMethod.FULL])
def test_a_supervised_method_is_its_own_adaptation(kind: TrainingMethod) -> None:
    spec = MethodSpec(type=kind)
    assert (spec.adaptation, spec.objective, spec.reference) == (MethodType(kind), Objective.SFT, ReferenceModel.NONE)
