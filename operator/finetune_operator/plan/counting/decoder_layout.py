"""A decoder's weight groups from its family spec and its config.json.

Each group mirrors one module transformers builds (`q_proj`, `experts`, a norm), with its
shape, how many layers have it, and how peft's LoRA sees it: whether `all-linear` adapts it,
which names in an explicit target list select it, and the rank peft gives it. Layers differ
only in their feed-forward block (dense or mixture of experts), which `moe_layer_count`
decides from the config the way each family's model class does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from finetune_operator.plan.counting.config_keys import ConfigView
from finetune_operator.plan.counting.decoder_spec import AttentionSpec, FamilySpec, MlpSpec, MoeSpec
from finetune_operator.plan.counting.weight_groups import WeightGroup, linear
from finetune_operator.plan.errors import UnknownArchitectureError

PEFT_FUSED_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen2_moe": {"router": ("gate",), "gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)},
    "mixtral": {"router": ("gate",), "gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)},
}
"""The transformers-4 module names peft maps onto a fused MoE's parameters (its
`_MOE_TARGET_MODULE_MAPPING`): listing them, or `all-linear`, adapts the experts and the
router `gate`; dense linears with those names are then no longer targeted as modules."""


@dataclass(frozen=True)
class Dims:
    """The sizes every family has."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int


@dataclass(frozen=True)
class DecoderLayout:
    """The groups of one decoder and the sizes the activation model needs."""

    dims: Dims
    groups: list[WeightGroup]
    intermediate: int
    """Per token through the feed-forward block: the dense MLP's, or one routed expert's."""
    num_experts: int
    experts_per_token: int
    tied: bool


def read_dims(spec: FamilySpec, config: ConfigView) -> Dims:
    hidden = config.size("hidden_size")
    heads = config.size("num_attention_heads")
    derived = hidden // heads
    head_dim = config.size("head_dim", derived) if spec.attention.head_dim == "config" else derived
    return Dims(
        hidden=hidden,
        heads=heads,
        kv_heads=config.size("num_key_value_heads", heads),
        head_dim=head_dim,
        layers=config.size("num_hidden_layers"),
        vocab=config.size("vocab_size"),
    )


def attention_groups(spec: AttentionSpec, config: ConfigView, dims: Dims, layers: int) -> list[WeightGroup]:
    if spec.layout == "mla":
        return _mla_groups(config, dims, layers)
    h, q, kv = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    qkv_bias, o_bias = spec.qkv_bias.read(config), spec.o_bias.read(config)
    if spec.layout == "fused":
        groups = [linear(spec.fused_name, h, q + 2 * kv, layers, bias=qkv_bias)]
    elif spec.layout == "separate":
        groups = [
            linear(name, h, out, layers, bias=qkv_bias) for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv))
        ]
    else:
        raise ValueError(f"attention layout {spec.layout!r}")
    groups.append(linear(spec.output_name, h if spec.output_from_hidden else q, h, layers, bias=o_bias))
    if spec.qk_norm != "none" and spec.qk_norm_on.read(config):
        q_size, k_size = {
            "head": (dims.head_dim, dims.head_dim),
            "projection": (q, kv),
            "hidden": (h, h // dims.heads * dims.kv_heads),
        }[spec.qk_norm]
        groups += [
            WeightGroup("q_norm", "norm", spec.qk_norm_params, q_size, layers),
            WeightGroup("k_norm", "norm", spec.qk_norm_params, k_size, layers),
        ]
    if spec.sinks:
        groups.append(WeightGroup("sinks", "other", 1, dims.heads, layers))
    if spec.extra_per_head_dim:
        groups.append(WeightGroup("attention_extra", "other", 1, spec.extra_per_head_dim * dims.head_dim, layers))
    return groups


def _mla_groups(config: ConfigView, dims: Dims, layers: int) -> list[WeightGroup]:
    """DeepSeek-V2/V3's multi-head latent attention: queries through an optional low-rank
    bottleneck, keys and values through a shared compressed latent plus a rotary part."""
    h, heads = dims.hidden, dims.heads
    bias = config.flag("attention_bias", False)
    nope, rope = config.size("qk_nope_head_dim"), config.size("qk_rope_head_dim")
    v_dim, kv_rank = config.size("v_head_dim"), config.size("kv_lora_rank")
    q_rank = config.optional_size("q_lora_rank")
    if q_rank is None:
        groups = [linear("q_proj", h, heads * (nope + rope), layers)]
    else:
        groups = [
            linear("q_a_proj", h, q_rank, layers, bias=bias),
            WeightGroup("q_a_layernorm", "norm", 1, q_rank, layers),
            linear("q_b_proj", q_rank, heads * (nope + rope), layers),
        ]
    return [
        *groups,
        linear("kv_a_proj_with_mqa", h, kv_rank + rope, layers, bias=bias),
        WeightGroup("kv_a_layernorm", "norm", 1, kv_rank, layers),
        linear("kv_b_proj", kv_rank, heads * (nope + v_dim), layers),
        linear("o_proj", heads * v_dim, h, layers, bias=bias),
    ]


def mlp_groups(spec: MlpSpec, config: ConfigView, hidden: int, inter: int, layers: int) -> list[WeightGroup]:
    bias = spec.bias.read(config)
    if spec.layout == "gated":
        gate, up, down = spec.names
        return [linear(gate, hidden, inter, layers, bias=bias), linear(up, hidden, inter, layers, bias=bias),
                linear(down, inter, hidden, layers, bias=bias)]  # fmt: skip
    if spec.layout == "fused":
        gate_up, down = spec.names
        return [linear(gate_up, hidden, 2 * inter, layers, bias=bias), linear(down, inter, hidden, layers, bias=bias)]
    if spec.layout == "plain":
        up, down = spec.names
        return [linear(up, hidden, inter, layers, bias=bias), linear(down, inter, hidden, layers, bias=bias)]
    raise ValueError(f"mlp layout {spec.layout!r}")


def moe_layer_count(spec: MoeSpec, config: ConfigView, layers: int) -> int:
    """How many layers have the mixture of experts (the others a dense MLP)."""
    kinds = config.word_list("mlp_layer_types", ("dense", "sparse"), layers)
    if kinds is not None:
        return kinds.count("sparse")
    rule = spec.layers
    if rule == "all":
        return layers
    if rule == "sparse_step":
        step, dense = config.size("decoder_sparse_step", 1), set(config.number_list("mlp_only_layers") or [])
        return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if rule == "first_k_dense":  # transformers reads no `moe_layer_freq` (DeepSeek's own code did)
        return max(0, layers - config.count("first_k_dense_replace"))
    if rule == "ernie":
        start, interval = config.count("moe_layer_start_index"), config.size("moe_layer_interval", 1)
        end = config.count("moe_layer_end_index", layers - 1)
        return sum(1 for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end)
    raise ValueError(f"MoE layer rule {rule!r}")


def moe_groups(
    spec: MoeSpec, config: ConfigView, hidden: int, layers: int, shared_mlp: MlpSpec
) -> tuple[list[WeightGroup], int, int]:
    """The router, the fused experts and any shared experts of `layers` MoE layers; with the
    number of experts and the experts each token is routed to."""
    experts = config.size("num_experts")
    per_token = config.size("num_experts_per_tok")
    inter = config.size(spec.expert_intermediate)
    router = linear(spec.router_name, hidden, experts, layers, bias=spec.router_bias.read(config), kind="router")
    if not spec.router_is_linear:
        router = replace(router, all_linear=False, targets=())
    bias = spec.expert_bias
    groups = [
        router,
        WeightGroup("gate_up_proj", "experts", hidden, 2 * inter, layers, bias, experts, module="experts"),
        WeightGroup("down_proj", "experts", inter, hidden, layers, bias, experts, module="experts"),
    ]
    if spec.router_extra:
        groups.append(WeightGroup("router_extra", "other", 1, spec.router_extra * experts, layers))
    shared = spec.shared_size(config) if spec.shared_size is not None else 0
    if shared:
        groups += mlp_groups(replace(shared_mlp, layout="gated", names=MlpSpec().names), config, hidden, shared, layers)
        if spec.shared_gate:
            groups.append(linear("shared_expert_gate", hidden, 1, layers))
    return groups, experts, per_token


def apply_peft_fusion(groups: list[WeightGroup], fusion: str | None) -> list[WeightGroup]:
    """How peft targets an MoE model whose experts transformers fused (see `PEFT_FUSED_NAMES`)."""
    if fusion is None:
        return groups
    names = PEFT_FUSED_NAMES[fusion]
    consumed = {name for targets in names.values() for name in targets}
    out = []
    for group in groups:
        if group.kind == "experts":
            targets = names[group.name]
            out.append(replace(group, all_linear=True, targets=targets, rank_factor=len(targets)))
        elif group.kind == "router" and group.name in names["router"]:
            out.append(replace(group, all_linear=True, targets=names["router"]))
        elif group.kind == "linear" and group.name in consumed:
            out.append(replace(group, all_linear=False, targets=()))
        else:
            out.append(group)
    return out


def decoder_layout(spec: FamilySpec, config: ConfigView) -> DecoderLayout:
    """Every weight group of a decoder-only model of this family."""
    dims = read_dims(spec, config)
    h, layers = dims.hidden, dims.layers
    groups = [WeightGroup("embed_tokens", "embedding", dims.vocab, h, 1)]
    groups += attention_groups(spec.attention, config, dims, layers)
    moe_layers = moe_layer_count(spec.moe, config, layers) if spec.moe is not None else 0
    experts = per_token = 1
    inter = 0
    if moe_layers < layers:
        inter = config.size(spec.mlp.intermediate)
        groups += mlp_groups(spec.mlp, config, h, inter, layers - moe_layers)
    if spec.moe is not None and moe_layers:
        moe, experts, per_token = moe_groups(spec.moe, config, h, moe_layers, spec.mlp)
        groups += moe
        inter = config.size(spec.moe.expert_intermediate) if moe_layers * 2 >= layers else inter
    if spec.layer_norms and spec.norm_params:
        groups.append(WeightGroup("layernorm", "norm", spec.norm_params, h, layers * spec.layer_norms))
    if spec.final_norm and spec.norm_params:
        groups.append(WeightGroup("norm", "norm", spec.norm_params, h, 1))
    groups += [WeightGroup(extra.name, "other", 1, extra.size(config), layers) for extra in spec.extras]
    tied = spec.tie.read(config)
    head_bias = spec.head_bias.read(config)
    if not tied:
        groups.append(WeightGroup("lm_head", "head", h, dims.vocab, 1, head_bias))
    elif head_bias:  # the weight is the embedding's, the bias the head's own
        groups.append(WeightGroup("lm_head_bias", "other", 1, dims.vocab, 1))
    groups = apply_peft_fusion(groups, spec.moe.peft_fusion if spec.moe is not None else None)
    if any(g.copies <= 0 for g in groups):
        raise UnknownArchitectureError(f"config.json of this {config.model_type} model describes an empty layer")
    return DecoderLayout(dims, groups, inter, experts, per_token, tied)
