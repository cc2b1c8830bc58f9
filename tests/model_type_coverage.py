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


def _overrides(default: Any, switched: bool) -> dict[str, Any]:
    known = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    overrides = {name: value for name, value in TINY.items() if name in known}
    if switched:
        overrides |= {name: not bool(getattr(default, name)) for name in FLIPPED if name in known}
        overrides["head_dim"] = SWITCHED_HEAD_DIM
    return overrides


def tiny_config(model_type: str, switched: bool = False) -> dict[str, Any]:
    """The config.json (as `save_pretrained` writes it) of a tiny model of this type; the class's
    defaults where its validation rejects the tiny sizes. An image-text model gets a tiny text
    config and a one-layer vision tower."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
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
    return saved


def _meta(config: dict[str, Any], lora_r: int | None, targets: list[str]) -> tuple[int, int, int] | str:
    from finetune_operator.plan.meta_count import count_on_meta

    try:
        counts = count_on_meta(copy.deepcopy(config), lora_r, targets)
    except ValueError as exc:  # peft: no target module found
        return f"peft refuses: {str(exc)[:120]}"
    return counts.base_total, counts.trainable, counts.largest_layer


def _planned(config: dict[str, Any], lora_r: int | None, targets: list[str]) -> tuple[int, int, int] | str:
    from finetune_operator.plan.errors import UnknownArchitectureError
    from finetune_operator.plan.param_count import architecture_shape, count_parameters

    try:
        counts = count_parameters(architecture_shape(config), lora_r, targets)
    except UnknownArchitectureError as exc:
        return f"planner refuses: {exc}"
    return counts.base_total, counts.trainable, counts.largest_layer


CASES: tuple[tuple[int | None, list[str]], ...] = ((None, []), (8, ["all-linear"]), (8, ["q_proj", "v_proj"]))


def check(model_type: str, switched: bool = False) -> Coverage:
    """Exact, refused (naming the model_type), or wrong, for one model_type."""
    from finetune_operator.plan.errors import UnknownArchitectureError
    from finetune_operator.plan.param_count import architecture_shape

    if model_type in EXCLUDED:
        try:
            architecture_shape({"model_type": model_type})
        except UnknownArchitectureError:
            return Coverage(model_type, "excluded", EXCLUDED[model_type])
        return Coverage(model_type, "wrong", "the planner claims to count a model that is not decoder-only text")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = tiny_config(model_type, switched)
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


def coverage(switched: bool = False) -> list[Coverage]:
    return [check(model_type, switched) for model_type in causal_lm_types()]


def main() -> None:
    import transformers

    results = {c.model_type: c for c in coverage()}
    switched = {c.model_type: c for c in coverage(switched=True)}
    text = [c for c in results.values() if c.status != "excluded"]
    exact = [c for c in text if c.status == "exact" and switched[c.model_type].status in ("exact", "unbuildable")]
    print(f"transformers {transformers.__version__}: {len(exact)} of {len(text)} decoder-only text model_types exact")
    print("\n| model_type | result |\n|---|---|")
    for plain in text:
        other = switched[plain.model_type]
        shown = other if plain.status == "exact" and other.status not in ("exact", "unbuildable") else plain
        print(f"| {shown.model_type} | {shown.status}{': ' + shown.detail if shown.status != 'exact' else ''} |")


if __name__ == "__main__":
    main()
