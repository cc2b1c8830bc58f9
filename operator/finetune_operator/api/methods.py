"""What each training method asks of the planner, the renderers and the trainer, the one place a
method is described. `method.type` names both halves at once: how the weights are adapted (lora,
qlora, full: a `MethodType`) and what they are trained towards (an `Objective`: sft, or the
preference objectives dpo and orpo, which adapt the weights as `method.preference.base` says,
LoRA by default). Each half has its descriptor.

The planner, the renderers and the reconcile policies read these traits, never the method's name:
"does the base model train?" (its gradients, optimizer states and a whole-model checkpoint),
"is the frozen base quantized?", "is there an adapter?". A new method is a new row here, a
trainer module for it, and whatever its own traits need, not a new branch in every memory term.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class MethodType(StrEnum):
    # How the weights are adapted: `method.type` of a supervised job, `method.preference.base` of a
    # preference one (no docstring: pydantic would put it into the CRD's schema)
    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"


class TrainingMethod(StrEnum):
    # `method.type`: a supervised method (lora, qlora, full) or a preference objective (dpo, orpo)
    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"
    DPO = "dpo"
    ORPO = "orpo"


class Objective(StrEnum):
    # What the weights are trained towards, read from `method.type`
    SFT = "sft"
    DPO = "dpo"
    ORPO = "orpo"


PREFERENCE_METHODS = (TrainingMethod.DPO, TrainingMethod.ORPO)
"""The `method.type` values that are preference objectives (their base in `method.preference.base`)."""


def objective_of(method: TrainingMethod | str) -> Objective:
    """The objective `method.type` trains towards: dpo and orpo are their own, the rest sft."""
    return Objective(method) if method in PREFERENCE_METHODS else Objective.SFT


class PreferenceLoss(StrEnum):
    # `method.preference.lossType`, DPO's loss as TRL names it
    SIGMOID = "sigmoid"
    IPO = "ipo"


class ReferenceModel(StrEnum):
    """The model a preference objective compares the policy against."""

    NONE = "none"
    """No reference: supervised fine-tuning, or ORPO."""
    ADAPTER_DISABLED = "adapter-disabled"
    """The policy's own base with its adapter switched off (LoRA, QLoRA): no extra weights."""
    START_ADAPTER = "start-adapter"
    """The base with the adapter the job started from (`model.adapter`, LoRA, QLoRA), frozen as it
    was loaded: a second copy of the adapter's weights, none of the base."""
    FROZEN_COPY = "frozen-copy"
    """A frozen copy of the base beside the policy (full), sharded like it under ZeRO-3."""
    PRECOMPUTED = "precomputed"
    """The reference's log-probabilities, computed once before training and kept with the
    prepared data (full, `precomputeReference`): no reference weights while training."""


@dataclass(frozen=True)
class MethodTraits:
    """How one method trains: what of the model gets gradients, how the frozen part is held."""

    base_trains: bool
    """Every base weight is trained: gradients, optimizer states and master copies for all of
    them, and checkpoints and the export hold the whole model. Otherwise only an adapter trains."""
    base_quantized: bool
    """The frozen base is loaded 4-bit (bitsandbytes) and dequantised for each matmul."""
    lighter: tuple[MethodType, ...] = ()
    """Methods of the same kind that need less memory, cheapest last: what the planner's advice
    tries when a job does not fit."""

    @property
    def has_adapter(self) -> bool:
        """An adapter trains on a frozen base (LoRA, QLoRA): what is saved and exported is the adapter."""
        return not self.base_trains


METHODS: Mapping[MethodType, MethodTraits] = MappingProxyType(
    {
        MethodType.LORA: MethodTraits(base_trains=False, base_quantized=False, lighter=(MethodType.QLORA,)),
        MethodType.QLORA: MethodTraits(base_trains=False, base_quantized=True),
        MethodType.FULL: MethodTraits(
            base_trains=True, base_quantized=False, lighter=(MethodType.LORA, MethodType.QLORA)
        ),
    }
)
"""Every method the API accepts, with its traits."""


def method_traits(method: MethodType | str) -> MethodTraits:
    """The traits of `method` (a `MethodType` or its value)."""
    return METHODS[MethodType(method)]


@dataclass(frozen=True)
class ObjectiveTraits:
    """What one objective trains towards: the rows it reads, the sequences and the reference it needs."""

    preference: bool
    """Rows are preference pairs (`dataset.format: preference`): a prompt, a chosen and a rejected answer."""
    sequences_per_example: int
    """Sequences one example feeds through the model (a preference pair is two: chosen and rejected)."""
    needs_reference: bool
    """The loss compares the policy with a reference model (DPO; ORPO is reference-free)."""


OBJECTIVES: Mapping[Objective, ObjectiveTraits] = MappingProxyType(
    {
        Objective.SFT: ObjectiveTraits(preference=False, sequences_per_example=1, needs_reference=False),
        Objective.DPO: ObjectiveTraits(preference=True, sequences_per_example=2, needs_reference=True),
        Objective.ORPO: ObjectiveTraits(preference=True, sequences_per_example=2, needs_reference=False),
    }
)
"""Every objective the API accepts, with its traits."""


def objective_traits(objective: Objective | str) -> ObjectiveTraits:
    """The traits of `objective` (an `Objective` or its value)."""
    return OBJECTIVES[Objective(objective)]


def reference_model(
    method: MethodType | str, objective: Objective | str, precompute: bool = False, start_adapter: bool = False
) -> ReferenceModel:
    """The reference `objective` trains against under `method`: none, the base with the adapter
    off (an adapter method; with `start_adapter`, `model.adapter`, the base with that adapter as
    loaded), or for full fine-tuning a frozen copy or precomputed log-probabilities."""
    if not objective_traits(objective).needs_reference:
        return ReferenceModel.NONE
    if method_traits(method).has_adapter:
        return ReferenceModel.START_ADAPTER if start_adapter else ReferenceModel.ADAPTER_DISABLED
    return ReferenceModel.PRECOMPUTED if precompute else ReferenceModel.FROZEN_COPY
