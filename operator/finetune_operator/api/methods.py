"""What each training method asks of the planner, the renderers and the trainer: one descriptor
per `method.type`, the one place a method is described.

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
    # `method.type` (no docstring: pydantic would put it into the CRD's schema)
    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"


class ReferenceModel(StrEnum):
    """The model a preference method compares the policy against."""

    NONE = "none"
    """Supervised fine-tuning: no reference."""


@dataclass(frozen=True)
class MethodTraits:
    """How one method trains: what of the model gets gradients, how the frozen part is held."""

    base_trains: bool
    """Every base weight is trained: gradients, optimizer states and master copies for all of
    them, and checkpoints and the export hold the whole model. Otherwise only an adapter trains."""
    base_quantized: bool
    """The frozen base is loaded 4-bit (bitsandbytes) and dequantised for each matmul."""
    reference: ReferenceModel = ReferenceModel.NONE
    """The reference model beside the policy."""
    sequences_per_example: int = 1
    """Sequences one example feeds through the model (a preference pair is two)."""
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
