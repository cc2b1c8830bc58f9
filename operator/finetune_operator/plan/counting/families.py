"""The decoder families the planner counts, one spec per transformers `model_type`.

Each entry says how that family's model class builds its weights (read from transformers'
`modeling_*.py`): which attention and MLP it uses, which config keys switch its biases,
norms and shared experts, and the defaults its configuration class applies when a
config.json leaves a key out. `tests/unit/test_plan_model_types.py` builds every
decoder-only text `model_type` of the installed transformers on the meta device and holds
each entry to exact totals, LoRA trainable counts and largest layer; a `model_type` with no
entry here is refused with a message that names it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from finetune_operator.api.loss_chunks import HEAD_POSTPROCESSING_ATTRIBUTES
from finetune_operator.plan.counting.config_keys import ConfigView
from finetune_operator.plan.counting.decoder_layout import decoder_layout
from finetune_operator.plan.counting.decoder_spec import (
    OFF,
    ON,
    AttentionSpec,
    Extra,
    FamilySpec,
    MlpSpec,
    MoeSpec,
    SizeRule,
    key,
)
from finetune_operator.plan.counting.family_defaults import FAMILY_DEFAULTS
from finetune_operator.plan.counting.vision_towers import gemma3_layout
from finetune_operator.plan.counting.weight_groups import ArchitectureShape, largest_module
from finetune_operator.plan.errors import UnknownArchitectureError


def _shared(size_key: str, count_key: str | None = None, count_default: int = 1) -> SizeRule:
    """Shared experts of `size_key` features, times `count_key` experts when the family has several."""

    def size(config: ConfigView) -> int:
        count = config.count(count_key, count_default) if count_key else 1
        return config.count(size_key) * count

    return size


LLAMA = FamilySpec()
SEPARATE_QKV_BIAS = AttentionSpec(qkv_bias=ON, o_bias=OFF)
HEAD_QK_NORM = AttentionSpec(qk_norm="head")
OLMO2_ATTENTION = AttentionSpec(qk_norm="projection")
FUSED_MLP = MlpSpec(layout="fused", names=("gate_up_proj", "down_proj"))
UP_DOWN_MLP = MlpSpec(layout="plain", names=("up_proj", "down_proj"))
DEEPSEEK_MOE = MoeSpec(layers="first_k_dense", shared_size=_shared("moe_intermediate_size", "n_shared_experts"))
QWEN_MOE = MoeSpec(layers="sparse_step")
BIAS_KEY_USE_BIAS = AttentionSpec(qkv_bias=key("use_bias"), o_bias=key("use_bias"))

FAMILIES: dict[str, FamilySpec] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "ministral": LLAMA,
    "ministral3": LLAMA,
    "cwm": LLAMA,
    "granite": LLAMA,
    "exaone": LLAMA,
    "internlm3": LLAMA,
    "iquestcoder": LLAMA,
    "arcee": FamilySpec(mlp=UP_DOWN_MLP),
    "helium": FamilySpec(attention=AttentionSpec(o_bias=OFF, output_from_hidden=True)),
    "smollm3": LLAMA,
    "hyperclovax": FamilySpec(layer_norms=4),
    "diffllama": FamilySpec(attention=AttentionSpec(extra_per_head_dim=4)),
    "bitnet": FamilySpec(
        extras=(
            Extra("attn_sub_norm", lambda c: c.size("hidden_size")),
            Extra("ffn_sub_norm", lambda c: c.size("intermediate_size")),
        )
    ),
    "mixtral": FamilySpec(moe=MoeSpec(expert_intermediate="intermediate_size", peft_fusion="mixtral")),
    "minimax_m2": FamilySpec(
        attention=OLMO2_ATTENTION, moe=MoeSpec(expert_intermediate="intermediate_size", peft_fusion="mixtral")
    ),
    "qwen2": FamilySpec(attention=SEPARATE_QKV_BIAS),
    "qwen2_moe": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("qkv_bias", True), o_bias=OFF),
        moe=MoeSpec(
            layers="sparse_step",
            shared_size=_shared("shared_expert_intermediate_size"),
            shared_gate=True,
            peft_fusion=None,
        ),
    ),
    "qwen3": FamilySpec(attention=HEAD_QK_NORM),
    "qwen3_moe": FamilySpec(attention=HEAD_QK_NORM, moe=QWEN_MOE),
    "seed_oss": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("attention_bias", True), o_bias=key("attention_out_bias"))
    ),
    "gemma": FamilySpec(tie=key("tie_word_embeddings", True), activation_family="gemma"),
    "gemma2": FamilySpec(layer_norms=4, tie=key("tie_word_embeddings", True), activation_family="gemma2"),
    "gemma3_text": FamilySpec(
        attention=HEAD_QK_NORM, layer_norms=4, tie=key("tie_word_embeddings", True), activation_family="gemma3"
    ),
    "vaultgemma": FamilySpec(tie=key("tie_word_embeddings", True), activation_family="gemma2"),
    "olmo": FamilySpec(norm_params=0),
    "olmo2": FamilySpec(attention=OLMO2_ATTENTION, activation_family="olmo2"),
    "olmo3": FamilySpec(attention=OLMO2_ATTENTION, activation_family="olmo2"),
    "olmoe": FamilySpec(
        attention=AttentionSpec(qk_norm="hidden"), moe=MoeSpec(expert_intermediate="intermediate_size")
    ),
    "flex_olmo": FamilySpec(
        attention=OLMO2_ATTENTION, moe=MoeSpec(expert_intermediate="intermediate_size"), activation_family="olmo2"
    ),
    "exaone4": FamilySpec(attention=HEAD_QK_NORM, activation_family="olmo2"),
    "granitemoe": FamilySpec(
        moe=MoeSpec(expert_intermediate="intermediate_size", router_name="router", peft_fusion=None)
    ),
    "granitemoeshared": FamilySpec(
        moe=MoeSpec(expert_intermediate="intermediate_size", router_name="router", peft_fusion=None)
    ),
    "granite_swa": FamilySpec(attention=AttentionSpec(sinks=True), tie=key("tie_word_embeddings", True)),
    "granitemoe_swa": FamilySpec(
        attention=AttentionSpec(sinks=True),
        moe=MoeSpec(expert_intermediate="intermediate_size", router_name="router", peft_fusion=None),
    ),
    "glm": FamilySpec(attention=AttentionSpec(qkv_bias=key("attention_bias", True), o_bias=OFF), mlp=FUSED_MLP),
    "glm4": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("attention_bias", True), o_bias=OFF), mlp=FUSED_MLP, layer_norms=4
    ),
    "glm4_moe": FamilySpec(
        attention=AttentionSpec(o_bias=OFF, qk_norm="head", qk_norm_on=key("use_qk_norm")), moe=DEEPSEEK_MOE
    ),
    "sarvam_moe": FamilySpec(
        attention=AttentionSpec(o_bias=OFF, qk_norm="head", qk_norm_on=key("use_qk_norm")),
        moe=replace(DEEPSEEK_MOE, peft_fusion=None),
    ),
    "cohere": FamilySpec(
        attention=AttentionSpec(qk_norm="projection", qk_norm_on=key("use_qk_norm")),
        layer_norms=1,
        tie=key("tie_word_embeddings", True),
    ),
    "cohere2": FamilySpec(layer_norms=1, tie=key("tie_word_embeddings", True)),
    "stablelm": FamilySpec(
        attention=AttentionSpec(
            qkv_bias=key("use_qkv_bias"),
            o_bias=OFF,
            head_dim="derived",
            output_from_hidden=True,
            qk_norm="projection",
            qk_norm_on=key("qk_layernorm"),
        ),
        norm_params=2,
    ),
    "starcoder2": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("use_bias", True), o_bias=key("use_bias", True)),
        mlp=MlpSpec(layout="plain", names=("c_fc", "c_proj"), bias=key("use_bias", True)),
        norm_params=2,
        tie=key("tie_word_embeddings", True),
    ),
    "jais2": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("attention_bias", True), o_bias=key("attention_bias", True)),
        mlp=MlpSpec(layout="plain", names=("up_proj", "down_proj"), bias=key("mlp_bias", True)),
        norm_params=2,
    ),
    "nemotron": FamilySpec(mlp=UP_DOWN_MLP, norm_params=2),
    "apertus": FamilySpec(attention=HEAD_QK_NORM, mlp=UP_DOWN_MLP, extras=(Extra("act_fn", lambda c: 2),)),
    "ernie4_5": FamilySpec(
        attention=BIAS_KEY_USE_BIAS, mlp=MlpSpec(bias=key("use_bias")), tie=key("tie_word_embeddings", True)
    ),
    "ernie4_5_moe": FamilySpec(
        attention=BIAS_KEY_USE_BIAS,
        mlp=MlpSpec(bias=key("use_bias")),
        moe=MoeSpec(
            layers="ernie", router_extra=1, shared_size=_shared("moe_intermediate_size", "moe_num_shared_experts", 0)
        ),
        tie=key("tie_word_embeddings", True),
        head_bias=key("use_bias"),
    ),
    "hunyuan_v1_dense": FamilySpec(attention=HEAD_QK_NORM),
    "hunyuan_v1_moe": FamilySpec(
        attention=HEAD_QK_NORM,
        moe=MoeSpec(
            expert_intermediate="intermediate_size",
            router_name="wg",
            router_is_linear=True,
            shared_size=_shared("intermediate_size", "num_shared_expert"),
        ),
    ),
    "deepseek_v2": FamilySpec(attention=AttentionSpec(layout="mla"), moe=DEEPSEEK_MOE),
    "deepseek_v3": FamilySpec(attention=AttentionSpec(layout="mla"), moe=DEEPSEEK_MOE),
    "sarvam_mla": FamilySpec(attention=AttentionSpec(layout="mla"), moe=DEEPSEEK_MOE),
    "glm4_moe_lite": FamilySpec(attention=AttentionSpec(layout="mla"), moe=DEEPSEEK_MOE),
    "youtu": FamilySpec(attention=AttentionSpec(layout="mla"), tie=key("tie_word_embeddings", True)),
    "dots1": FamilySpec(attention=HEAD_QK_NORM, moe=DEEPSEEK_MOE),
    "solar_open": FamilySpec(
        attention=AttentionSpec(o_bias=OFF),
        moe=MoeSpec(shared_size=_shared("moe_intermediate_size", "n_shared_experts")),
    ),
    "mellum": FamilySpec(attention=HEAD_QK_NORM, moe=MoeSpec()),
    "phimoe": FamilySpec(
        moe=MoeSpec(
            expert_intermediate="intermediate_size", router_name="router", router_is_linear=True, peft_fusion=None
        ),
        norm_params=2,
        head_bias=key("lm_head_bias"),
    ),
    "phi3": FamilySpec(
        attention=AttentionSpec(layout="fused", qkv_bias=OFF, o_bias=OFF), mlp=FUSED_MLP, activation_family="phi3"
    ),
    "gpt_oss": FamilySpec(
        attention=AttentionSpec(qkv_bias=key("attention_bias", True), o_bias=key("attention_bias", True), sinks=True),
        moe=MoeSpec(
            expert_intermediate="intermediate_size",
            router_name="router",
            router_bias=ON,
            expert_bias=True,
            peft_fusion=None,
        ),
        activation_family="gpt_oss",
    ),
    "nanochat": FamilySpec(mlp=MlpSpec(layout="plain", names=("fc1", "fc2")), norm_params=0),
}
"""model_type → how transformers lays out that family's weights."""


WITH_VISION_TOWER = {"gemma3": "gemma3_text"}
"""Image-text model_types whose causal-LM class is the text family's decoder plus a vision tower."""


def counted_model_types() -> list[str]:
    return sorted([*FAMILIES, *WITH_VISION_TOWER])


def describe(config: dict[str, Any]) -> ArchitectureShape:
    """The weight groups and dimensions of a config.json; a family with no entry is refused by name."""
    model_type = str(config.get("model_type") or "")
    text_family = WITH_VISION_TOWER.get(model_type, model_type)
    spec = FAMILIES.get(text_family)
    if spec is None:
        raise UnknownArchitectureError(
            f"model_type {model_type or '(missing)'!r} is not a family the planner can count "
            f"({len(FAMILIES) + len(WITH_VISION_TOWER)} are, e.g. llama, qwen3, gemma3, deepseek_v3); pick a "
            "catalogue model with the same architecture in model.architecture"
        )
    view = ConfigView(config, model_type, FAMILY_DEFAULTS.get(model_type, {}))
    layout = gemma3_layout(view, spec) if model_type in WITH_VISION_TOWER else decoder_layout(spec, view)
    text = view.sub("text_config", text_family) if model_type in WITH_VISION_TOWER else view
    dims = layout.dims
    return ArchitectureShape(
        family=model_type,
        vocab_size=dims.vocab,
        hidden_size=dims.hidden,
        num_layers=dims.layers,
        num_heads=dims.heads,
        num_kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        intermediate_size=layout.intermediate,
        groups=tuple(layout.groups),
        largest_module_params=largest_module(layout.groups),
        num_experts=layout.num_experts,
        experts_per_token=layout.experts_per_token,
        tied_embeddings=layout.tied,
        logit_softcapping=bool(text.value("final_logit_softcapping")),
        full_logits=any(
            (view.value(name) if name in view.raw else text.value(name)) not in (None, 1, 1.0)
            for name in HEAD_POSTPROCESSING_ATTRIBUTES
        ),
        traits=spec.activation_family,
    )
