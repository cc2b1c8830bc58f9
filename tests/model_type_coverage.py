"""Which decoder-only text `model_type`s the closed-form counter counts exactly.

Every entry of the installed transformers' causal-LM mapping gets a tiny config (small
widths with distinct sizes, so a swapped dimension shows), is built on the meta device, and
its total, LoRA trainable (`all-linear`, and `q_proj, v_proj`) and largest-module counts
are compared with the planner's. The planner either agrees exactly or refuses with a
message naming the model_type; anything else is a wrong number. A second variant turns the
config's optional parts the other way (biases, tied embeddings, q/k norms, an explicit
head_dim), so a family spec that ignores a key the model class reads, or reads one it
ignores, is caught too.

`python -m tests.model_type_coverage` prints the coverage table.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

NOT_DECODER_ONLY_TEXT: dict[str, tuple[str, ...]] = {
    "an encoder used as a decoder": (
        "bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert",
        "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm-roberta", "xlm-roberta-xl",
        "xmod", "xlm", "xlnet", "reformer",
    ),
    "the decoder of an encoder-decoder": (
        "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart",
        "prophetnet", "trocr", "whisper",
    ),
    "images, audio or video beside text": (
        "emu3", "fuyu", "gemma3n", "gemma4", "gemma4_unified", "gemma4_unified_assistant", "git", "got_ocr2",
        "llama4", "mllama", "moshi", "moss_transcribe_diarize", "musicgen", "musicgen_melody", "phi4_multimodal",
        "qwen3_5", "qwen3_5_moe", "qwen4_exp", "dots3_note",
    ),
}  # fmt: skip
"""Causal-LM entries that are not decoder-only text models (gemma3 is counted: its vision tower
is part of what the trainer loads for `google/gemma-3-*`)."""

EXCLUDED = {model_type: reason for reason, types in NOT_DECODER_ONLY_TEXT.items() for model_type in types}

TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "intermediate_size": 80,
    "moe_intermediate_size": 40,
    "shared_expert_intermediate_size": 56,
    "num_hidden_layers": 4,
    "vocab_size": 160,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "n_group": 2,
    "topk_group": 1,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""Small sizes, distinct where a swap would hide (q heads × head_dim ≠ hidden ≠ intermediate)."""

TINY_VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
               "image_size": 28, "patch_size": 14}  # fmt: skip

SWITCHED_HEAD_DIM = 20
FLIPPED = ("attention_bias", "mlp_bias", "tie_word_embeddings", "use_qk_norm", "qk_layernorm", "use_bias",
           "use_qkv_bias", "qkv_bias", "attention_out_bias", "lm_head_bias")  # fmt: skip


@dataclass(frozen=True)
class Coverage:
    model_type: str
    status: str  # exact | refused | wrong | unbuildable | excluded
    detail: str = ""


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def decoder_only_text_types() -> list[str]:
    return [model_type for model_type in causal_lm_types() if model_type not in EXCLUDED]


VARIANTS = ("tiny", "switched", "minimal")
"""`tiny`: small sizes, the class's defaults otherwise; `switched`: optional parts turned the other
way; `minimal`: only what differs from the class's defaults, as an older config.json leaves it."""


def _overrides(default: Any, switched: bool) -> dict[str, Any]:
    known = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    overrides = {name: value for name, value in TINY.items() if name in known}
    if switched:
        overrides |= {name: not bool(getattr(default, name)) for name in FLIPPED if name in known}
        overrides["head_dim"] = SWITCHED_HEAD_DIM
    return overrides


def _without_defaults(saved: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in saved.items():
        if isinstance(value, dict) and isinstance(default.get(key), dict):
            out[key] = _without_defaults(value, default[key])
        elif key == "model_type" or default.get(key, object()) != value:
            out[key] = value
    return out


def tiny_config(model_type: str, variant: str = "tiny") -> dict[str, Any]:
    """The config.json (as `save_pretrained` writes it) of a tiny model of this type; the class's
    defaults where its validation rejects the tiny sizes. An image-text model gets a tiny text
    config and a one-layer vision tower."""
    from transformers import AutoConfig

    switched = variant == "switched"
    try:
        default = AutoConfig.for_model(model_type)
    except Exception:  # a class whose own defaults fail its validation: the model_type alone
        return {"model_type": model_type}
    overrides = _overrides(default, switched)
    if hasattr(default, "text_config") and hasattr(default, "vision_config"):
        text = _overrides(default.text_config, switched)
        overrides = {k: v for k, v in overrides.items() if k in FLIPPED} | {
            "text_config": text,
            "vision_config": TINY_VISION,
        }
    try:
        config = AutoConfig.for_model(model_type, **overrides)
    except Exception:  # validation of sizes the tiny values break
        config = default
    saved: dict[str, Any] = config.to_diff_dict()
    saved["model_type"] = model_type
    return _without_defaults(saved, default.to_dict()) if variant == "minimal" else saved


def _meta(config: dict[str, Any], lora_r: int | None, targets: list[str]) -> tuple[int, int, int] | str:
    from finetune_operator.plan.counting.meta_count import count_on_meta

    try:
        counts = count_on_meta(copy.deepcopy(config), lora_r, targets)
    except ValueError as exc:  # peft: no target module found
        return f"peft refuses: {str(exc)[:120]}"
    return counts.base_total, counts.trainable, counts.largest_layer


def _planned(config: dict[str, Any], lora_r: int | None, targets: list[str]) -> tuple[int, int, int] | str:
    from finetune_operator.plan.counting.param_count import architecture_shape, count_parameters
    from finetune_operator.plan.errors import UnknownArchitectureError

    try:
        counts = count_parameters(architecture_shape(config), lora_r, targets)
    except UnknownArchitectureError as exc:
        return f"planner refuses: {exc}"
    return counts.base_total, counts.trainable, counts.largest_layer


CASES: tuple[tuple[int | None, list[str]], ...] = ((None, []), (8, ["all-linear"]), (8, ["q_proj", "v_proj"]))


def check(model_type: str, variant: str = "tiny") -> Coverage:
    """Exact, refused (naming the model_type), or wrong, for one model_type."""
    from finetune_operator.plan.counting.param_count import architecture_shape
    from finetune_operator.plan.errors import UnknownArchitectureError

    if model_type in EXCLUDED:
        try:
            architecture_shape({"model_type": model_type})
        except UnknownArchitectureError:
            return Coverage(model_type, "excluded", EXCLUDED[model_type])
        return Coverage(model_type, "wrong", "the planner claims to count a model that is not decoder-only text")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = tiny_config(model_type, variant)
        try:
            architecture_shape(config)
        except UnknownArchitectureError as exc:
            named = model_type in str(exc)
            return Coverage(model_type, "refused" if named else "wrong", str(exc)[:200])
        try:
            meta = [_meta(config, r, targets) for r, targets in CASES]
        except Exception as exc:  # a config transformers itself cannot build
            return Coverage(model_type, "unbuildable", f"{type(exc).__name__}: {str(exc)[:160]}")
    planned = [_planned(config, r, targets) for r, targets in CASES]
    for (r, targets), got, want in zip(CASES, planned, meta, strict=True):
        both_refuse = isinstance(got, str) and isinstance(want, str)
        if got != want and not both_refuse:
            return Coverage(model_type, "wrong", f"lora_r={r} {targets}: planner {got}, meta device {want}")
    return Coverage(model_type, "exact")


def coverage(variant: str = "tiny") -> list[Coverage]:
    return [check(model_type, variant) for model_type in causal_lm_types()]


def summary(results: dict[str, dict[str, Coverage]]) -> tuple[list[str], dict[str, Coverage]]:
    """The exact types (every variant exact, or unbuildable by transformers itself) and each type's
    shown result (its first variant that is not exact)."""
    exact, shown = [], {}
    for model_type, by_variant in results.items():
        first = by_variant["tiny"]
        if first.status == "excluded":
            continue
        others = [by_variant[v] for v in VARIANTS[1:]]
        wrong = next((c for c in others if c.status not in ("exact", "unbuildable")), None)
        if first.status == "exact" and wrong is None:
            exact.append(model_type)
        shown[model_type] = first if first.status != "exact" or wrong is None else wrong
    return exact, shown


def main() -> None:
    import transformers

    results: dict[str, dict[str, Coverage]] = {}
    for variant in VARIANTS:
        for result in coverage(variant):
            results.setdefault(result.model_type, {})[variant] = result
    exact, shown = summary(results)
    print(f"transformers {transformers.__version__}: {len(exact)} of {len(shown)} decoder-only text model_types exact")
    print("\n| model_type | result |\n|---|---|")
    for model_type, result in shown.items():
        detail = f": {result.detail}" if result.status != "exact" else ""
        print(f"| {model_type} | {result.status}{detail} |")


if __name__ == "__main__":
    main()


COUNTED_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
    "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok", "moe_topk", "moe_k",
    "decoder_sparse_step", "mlp_only_layers", "first_k_dense_replace", "moe_layer_start_index",
    "moe_layer_end_index", "moe_layer_interval", "n_shared_experts",
    "moe_num_shared_experts", "num_shared_expert", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "attention_bias", "attention_out_bias", "mlp_bias", "use_bias", "qkv_bias",
    "use_qkv_bias", "use_qk_norm", "qk_layernorm", "tie_word_embeddings", "lm_head_bias",
    "final_logit_softcapping", "logit_scale", "logits_scaling",
)  # fmt: skip
"""Every config key the closed-form counter reads (through `ConfigView`)."""


def config_class_defaults(model_type: str) -> dict[str, Any]:
    """The values transformers' configuration class declares for the counted keys a config.json leaves
    out (None, derived from other keys after construction, is left to the counter's own rule)."""
    import dataclasses

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    out = {}
    for field in dataclasses.fields(CONFIG_MAPPING[model_type]):
        if field.name not in COUNTED_KEYS:
            continue
        if field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = None if field.default is dataclasses.MISSING else field.default
        if value is not None:
            out[field.name] = value
    return out
