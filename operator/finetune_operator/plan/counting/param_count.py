"""Exact parameter counts from a config.json, in closed form, without torch.

The operator image carries no torch, yet the planner needs exact totals, the trainable
count under the job's LoRA settings, the largest single module (what ZeRO-3 gathers at
once) and the layer shapes (what activations are made of). Every family the planner
counts is described once in `families.py` as a spec of the pieces transformers builds;
`decoder_layout.py` turns a spec and a config into weight groups. `meta_count.py` builds
the real models on the meta device, and unit tests keep the two equal for every catalogue
entry and every decoder-only `model_type` of the installed transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from finetune_operator.plan.counting.families import describe
from finetune_operator.plan.counting.weight_groups import ArchitectureShape, WeightGroup
from finetune_operator.plan.errors import UnknownArchitectureError

ALL_LINEAR = "all-linear"

__all__ = [
    "ALL_LINEAR",
    "ArchitectureShape",
    "ParameterCounts",
    "WeightGroup",
    "architecture_shape",
    "count_parameters",
    "is_adapted",
    "lora_rank",
]


@dataclass(frozen=True)
class ParameterCounts:
    """What the memory model needs to know about a job's parameters."""

    base_total: int
    adapter: int
    trainable: int
    largest_layer: int
    quantizable: int
    adapted_inputs_per_layer: int
    adapted_ranks_per_layer: int

    @property
    def total(self) -> int:
        return self.base_total + self.adapter

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def architecture_shape(config: dict[str, Any]) -> ArchitectureShape:
    """The weight groups and dimensions of a config.json; unsupported families raise, naming the model_type."""
    return describe(config)


def is_adapted(group: WeightGroup, target_modules: Sequence[str]) -> bool:
    """Whether peft's LoRA with these `target_modules` adapts the group."""
    if ALL_LINEAR in target_modules:
        return group.all_linear
    return bool(group.targets) and all(name in target_modules for name in group.targets)


def lora_rank(group: WeightGroup, r: int) -> int:
    """peft gives a fused gate+up expert weight twice the rank, so each half gets r."""
    return group.rank_factor * r


def _check_fused_targets(shape: ArchitectureShape, target_modules: Sequence[str]) -> None:
    """peft refuses a list naming one half of a fused weight (gate_proj without up_proj)."""
    if ALL_LINEAR in target_modules:
        return
    for group in shape.groups:
        named = [name for name in group.targets if name in target_modules]
        if 0 < len(named) < len(group.targets):
            missing = sorted(set(group.targets) - set(named))
            raise UnknownArchitectureError(
                f"lora.targetModules lists {', '.join(named)} without {', '.join(missing)}: this {shape.family} "
                f"model fuses them into one {group.name} weight; list both or neither"
            )


def count_parameters(
    shape: ArchitectureShape, lora_r: int | None, target_modules: Sequence[str] = ()
) -> ParameterCounts:
    """Counts for full fine-tuning (`lora_r=None`) or LoRA with rank r on `target_modules`."""
    base = shape.total_params
    quantizable = sum(g.params for g in shape.groups if g.kind in ("linear", "experts"))
    if lora_r is None:
        return ParameterCounts(base, 0, base, shape.largest_module_params, quantizable, 0, 0)
    _check_fused_targets(shape, target_modules)
    adapted = [g for g in shape.groups if is_adapted(g, target_modules)]
    if not adapted:
        raise UnknownArchitectureError(
            f"lora.targetModules {list(target_modules)} match no linear layer of this {shape.family} model; "
            f"its linear layers are {sorted({g.name for g in shape.groups if g.targets})}"
        )
    adapter = sum(g.copies * g.experts * lora_rank(g, lora_r) * (g.in_features + g.out_features) for g in adapted)
    routed = shape.experts_per_token
    decoder = [g for g in adapted if g.part == "decoder"]
    inputs = sum(g.copies * g.in_features * (routed if g.kind == "experts" else 1) for g in decoder)
    ranks = sum(g.copies * lora_rank(g, lora_r) * (routed if g.kind == "experts" else 1) for g in decoder)
    layers = shape.num_layers
    return ParameterCounts(base, adapter, adapter, shape.largest_module_params, quantizable, inputs // layers,
                           ranks // layers)  # fmt: skip
