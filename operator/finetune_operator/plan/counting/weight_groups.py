"""One kind of weight in a model, as the planner counts it and as peft's LoRA sees it.

A `WeightGroup` stands for a module transformers builds once per layer (or once per model):
its shape, whether it holds a bias or one matrix per expert, and for LoRA whether
`all-linear` adapts it, which names in an explicit `targetModules` list select it, and the
rank peft gives it (a fused gate+up expert weight gets twice the rank, one r per half).
An `ArchitectureShape` is a model's groups with the dimensions the memory model reads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class WeightGroup:
    """One kind of module, `copies` times in the model (per-layer modules: once per layer that has it)."""

    name: str
    kind: str  # linear | router | experts | embedding | head | norm | other
    in_features: int
    out_features: int
    copies: int
    bias: bool = False
    experts: int = 1
    all_linear: bool = False
    """peft's `all-linear` adapts it (an `nn.Linear`, or a fused MoE parameter peft re-targets)."""
    targets: tuple[str, ...] = ()
    """The names that select it in a `targetModules` list (all of them, for a fused weight)."""
    rank_factor: int = 1
    module: str = ""
    """Groups with the same module name are one module (the experts' weights): DeepSpeed's
    largest layer sums them."""
    part: str = "decoder"
    """`decoder`, or a tower the text never passes through (`vision`)."""

    @property
    def params_each(self) -> int:
        bias = self.experts * self.out_features if self.bias else 0
        return self.experts * self.in_features * self.out_features + bias

    @property
    def params(self) -> int:
        return self.copies * self.params_each


def linear(
    name: str, in_features: int, out_features: int, copies: int, *, bias: bool = False, kind: str = "linear"
) -> WeightGroup:
    """An `nn.Linear`: `all-linear` adapts it, and so does listing its name."""
    return WeightGroup(name, kind, in_features, out_features, copies, bias, all_linear=True, targets=(name,))


@dataclass(frozen=True)
class ArchitectureShape:
    """The dimensions of a decoder-only model and its weight groups."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    groups: tuple[WeightGroup, ...]
    largest_module_params: int
    num_experts: int = 1
    experts_per_token: int = 1
    tied_embeddings: bool = False
    logit_softcapping: bool = False
    full_logits: bool = False
    """The model post-processes its head's output (soft-capping, scaling): the trainer's loss keeps the
    full logits instead of chunking them (`finetune_kernels.chunked_loss.output_head`)."""
    traits: str = ""
    """Whose activation inventory the family follows (`activation_traits.FAMILY_TRAITS`); the family's own
    name when empty."""

    @cached_property  # frozen: computed once per shape (the planner asks for it per candidate)
    def total_params(self) -> int:
        return sum(g.params for g in self.groups)

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: only the routed experts; no vision tower)."""
        share = self.experts_per_token / self.num_experts
        decoder = (g for g in self.groups if g.part == "decoder")
        return sum(round(g.params * share) if g.kind == "experts" else g.params for g in decoder)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def largest_module(groups: Sequence[WeightGroup]) -> int:
    """Parameters of the largest single module; groups naming one module are summed."""
    modules: dict[tuple[str, str], int] = defaultdict(int)
    alone = [g.params_each for g in groups if not g.module]
    for group in groups:
        if group.module:
            modules[(group.part, group.module)] += group.params_each
    return max(alone + list(modules.values()))
