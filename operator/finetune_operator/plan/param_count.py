"""Exact parameter counts from a config.json, in closed form, without torch.

The operator image carries no torch, yet the planner needs exact totals, the trainable
count under the job's LoRA settings, the largest single module (what ZeRO-3 gathers at
once) and the layer shapes (what activations are made of). Each supported family is
described once as a list of weight groups mirroring how transformers builds it;
`meta_count.py` builds the same models on the meta device and a unit test keeps the two
in agreement for every catalogue entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .errors import UnknownArchitectureError

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class WeightGroup:
    """One kind of module, `copies` times in the model (per-layer modules: once per layer)."""

    name: str
    kind: str  # linear | router | experts | embedding | head | norm
    in_features: int
    out_features: int
    copies: int
    bias: bool = False
    experts: int = 1

    @property
    def params_each(self) -> int:
        return self.experts * self.in_features * self.out_features + (self.out_features if self.bias else 0)

    @property
    def params(self) -> int:
        return self.copies * self.params_each


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

    @cached_property  # frozen: computed once per shape (the planner asks for it per candidate)
    def total_params(self) -> int:
        return sum(g.params for g in self.groups)

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through (MoE: only the routed experts)."""
        share = self.experts_per_token / self.num_experts
        return sum(round(g.params * share) if g.kind == "experts" else g.params for g in self.groups)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


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


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise UnknownArchitectureError(f"config.json has no {key!r}, which the planner needs to count parameters")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**40:
        raise UnknownArchitectureError(f"config.json {key!r} is {value!r}: the planner needs a positive whole number")
    return value


def _dims(config: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return (
        hidden,
        heads,
        kv_heads,
        head_dim,
        _int(config, "intermediate_size"),
        _int(config, "num_hidden_layers"),
        _int(config, "vocab_size"),
    )


def _llama_like(config: dict[str, Any], family: str) -> ArchitectureShape:
    hidden, heads, kv_heads, head_dim, inter, layers, vocab = _dims(config)
    qkv_bias = family == "qwen2" or bool(config.get("attention_bias", False))
    o_bias = family != "qwen2" and bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    norms_per_layer = 4 if family == "gemma2" else 2
    tied = bool(config.get("tie_word_embeddings", family == "gemma2"))
    groups = [
        WeightGroup("embed_tokens", "embedding", vocab, hidden, 1),
        WeightGroup("q_proj", "linear", hidden, q_dim, layers, qkv_bias),
        WeightGroup("k_proj", "linear", hidden, kv_dim, layers, qkv_bias),
        WeightGroup("v_proj", "linear", hidden, kv_dim, layers, qkv_bias),
        WeightGroup("o_proj", "linear", q_dim, hidden, layers, o_bias),
    ]
    experts, per_token = 1, 1
    if family == "mixtral":
        experts, per_token = _int(config, "num_local_experts"), _int(config, "num_experts_per_tok")
        groups += [
            WeightGroup("gate", "router", hidden, experts, layers),
            WeightGroup("gate_up_proj", "experts", hidden, 2 * inter, layers, experts=experts),
            WeightGroup("down_proj", "experts", inter, hidden, layers, experts=experts),
        ]
    else:
        groups += [
            WeightGroup("gate_proj", "linear", hidden, inter, layers, mlp_bias),
            WeightGroup("up_proj", "linear", hidden, inter, layers, mlp_bias),
            WeightGroup("down_proj", "linear", inter, hidden, layers, mlp_bias),
        ]
    groups.append(WeightGroup("layernorm", "norm", 1, hidden, layers * norms_per_layer + 1))
    if not tied:
        groups.append(WeightGroup("lm_head", "head", hidden, vocab, 1))
    return _shape(family, config, groups, experts=experts, per_token=per_token, tied=tied)


def _phi3(config: dict[str, Any]) -> ArchitectureShape:
    hidden, heads, kv_heads, head_dim, inter, layers, vocab = _dims(config)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    tied = bool(config.get("tie_word_embeddings", False))
    groups = [
        WeightGroup("embed_tokens", "embedding", vocab, hidden, 1),
        WeightGroup("qkv_proj", "linear", hidden, q_dim + 2 * kv_dim, layers),
        WeightGroup("o_proj", "linear", q_dim, hidden, layers),
        WeightGroup("gate_up_proj", "linear", hidden, 2 * inter, layers),
        WeightGroup("down_proj", "linear", inter, hidden, layers),
        WeightGroup("layernorm", "norm", 1, hidden, layers * 2 + 1),
    ]
    if not tied:
        groups.append(WeightGroup("lm_head", "head", hidden, vocab, 1))
    return _shape("phi3", config, groups, experts=1, per_token=1, tied=tied)


def _shape(
    family: str, config: dict[str, Any], groups: list[WeightGroup], *, experts: int, per_token: int, tied: bool
) -> ArchitectureShape:
    hidden, heads, kv_heads, head_dim, inter, layers, vocab = _dims(config)
    expert_module = sum(g.params_each for g in groups if g.kind == "experts")
    largest = max([g.params_each for g in groups if g.kind != "experts"] + [expert_module])
    return ArchitectureShape(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        groups=tuple(groups),
        largest_module_params=largest,
        num_experts=experts,
        experts_per_token=per_token,
        tied_embeddings=tied,
        logit_softcapping=bool(config.get("final_logit_softcapping")),
    )


FAMILIES: dict[str, Callable[[dict[str, Any]], ArchitectureShape]] = {
    "llama": lambda c: _llama_like(c, "llama"),
    "mistral": lambda c: _llama_like(c, "mistral"),
    "mixtral": lambda c: _llama_like(c, "mixtral"),
    "qwen2": lambda c: _llama_like(c, "qwen2"),
    "gemma2": lambda c: _llama_like(c, "gemma2"),
    "phi3": _phi3,
}
"""model_type → how transformers lays out that family's weights."""


def architecture_shape(config: dict[str, Any]) -> ArchitectureShape:
    """The weight groups and dimensions of a config.json; unsupported families raise."""
    model_type = str(config.get("model_type", ""))
    describe = FAMILIES.get(model_type)
    if describe is None:
        raise UnknownArchitectureError(
            f"model_type {model_type or '(missing)'!r} is not a family the planner can count "
            f"(supported: {', '.join(sorted(FAMILIES))}); pick a catalogue model with the same "
            "architecture in model.architecture, or use method full with a supported family"
        )
    return describe(config)


def is_adapted(group: WeightGroup, target_modules: Sequence[str]) -> bool:
    if group.kind not in ("linear", "router", "experts"):
        return False
    if ALL_LINEAR in target_modules:
        return True
    module_name = "experts" if group.kind == "experts" else group.name
    return group.kind != "experts" and module_name in target_modules


def lora_rank(group: WeightGroup, r: int) -> int:
    """peft gives a fused gate+up expert weight twice the rank, so each half gets r."""
    return 2 * r if group.kind == "experts" and group.name == "gate_up_proj" else r


def count_parameters(
    shape: ArchitectureShape, lora_r: int | None, target_modules: Sequence[str] = ()
) -> ParameterCounts:
    """Counts for full fine-tuning (`lora_r=None`) or LoRA with rank r on `target_modules`."""
    base = shape.total_params
    quantizable = sum(g.params for g in shape.groups if g.kind in ("linear", "experts"))
    if lora_r is None:
        return ParameterCounts(base, 0, base, shape.largest_module_params, quantizable, 0, 0)
    adapted = [g for g in shape.groups if is_adapted(g, target_modules)]
    adapter = sum(g.copies * g.experts * lora_rank(g, lora_r) * (g.in_features + g.out_features) for g in adapted)
    if not adapted:
        raise UnknownArchitectureError(
            f"lora.targetModules {list(target_modules)} match no linear layer of this {shape.family} model; "
            f"its linear layers are {sorted({g.name for g in shape.groups if g.kind == 'linear'})}"
        )
    inputs = sum(g.in_features for g in adapted if g.kind != "experts")
    inputs += sum(g.in_features * shape.experts_per_token for g in adapted if g.kind == "experts")
    ranks = sum(lora_rank(g, lora_r) * (shape.experts_per_token if g.kind == "experts" else 1) for g in adapted)
    return ParameterCounts(base, adapter, adapter, shape.largest_module_params, quantizable, inputs, ranks)
