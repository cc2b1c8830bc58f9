"""Closed-form parameter counts agree with the real model classes and published totals."""

from __future__ import annotations

import pytest

from finetune_operator.plan.counting.param_count import architecture_shape, count_parameters
from finetune_operator.plan.errors import UnknownArchitectureError
from finetune_operator.plan.sources.model_source import catalogue_entries, catalogue_entry

PUBLISHED_TOTALS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-72b": 72_706_203_648,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "smollm2-135m-instruct": 134_515_008,
    "qwen3-0.6b": 596_049_920,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "qwen3-14b": 14_768_307_200,
    "qwen3-32b": 32_762_123_264,
    "qwen3-30b-a3b": 30_532_122_624,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.3-70b": 70_553_706_496,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 4_300_079_472,
    "gemma-3-12b": 12_187_325_040,
    "gemma-3-27b": 27_432_406_640,
    "phi-4": 14_659_507_200,
    "olmo-2-7b": 7_298_617_344,
    "granite-3.3-8b": 8_170_864_640,
    "gpt-oss-20b": 20_914_757_184,
}
"""Parameter totals the model cards and safetensors indexes report (Gemma 3 4B-27B with their vision
towers, gpt-oss-20b as bf16 parameters)."""


def test_catalogue_holds_the_promised_models() -> None:
    assert set(PUBLISHED_TOTALS) | {"tiny-llama"} == set(catalogue_entries())


@pytest.mark.parametrize("entry", sorted(PUBLISHED_TOTALS))
def test_closed_form_total_matches_published(entry: str) -> None:
    assert architecture_shape(catalogue_entry(entry).config).total_params == PUBLISHED_TOTALS[entry]


def test_llama2_7b_lora_r16_all_linear_is_the_well_known_40m() -> None:
    shape = architecture_shape(catalogue_entry("llama-2-7b").config)
    assert count_parameters(shape, 16, ["all-linear"]).trainable == 39_976_960


def test_named_targets_adapt_only_those_layers() -> None:
    shape = architecture_shape(catalogue_entry("llama-2-7b").config)
    counts = count_parameters(shape, 8, ["q_proj", "v_proj"])
    assert counts.trainable == 32 * 2 * 8 * (4096 + 4096)


def test_targets_matching_nothing_are_rejected() -> None:
    shape = architecture_shape(catalogue_entry("llama-2-7b").config)
    with pytest.raises(UnknownArchitectureError, match="match no linear layer"):
        count_parameters(shape, 8, ["qkv"])


def _meta_params() -> list[object]:
    return [
        pytest.param(
            entry,
            marks=()
            if entry in ("tiny-llama", "phi-3-mini", "smollm2-135m-instruct", "qwen3-0.6b")
            else pytest.mark.slow,
        )
        for entry in catalogue_entries()
    ]


@pytest.mark.parametrize("entry", _meta_params())
def test_closed_form_equals_meta_device_counts(entry: str) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from finetune_operator.plan.counting.meta_count import count_on_meta

    config = catalogue_entry(entry).config
    closed = count_parameters(architecture_shape(config), 16, ["all-linear"])
    meta = count_on_meta(config, 16, ["all-linear"])
    assert (closed.base_total, closed.trainable, closed.total, closed.largest_layer) == (
        meta.base_total,
        meta.trainable,
        meta.total,
        meta.largest_layer,
    )


def test_smollm2_entry_counts_exactly_the_packaged_checkpoint() -> None:
    """The catalogue's SmolLM2 total equals the element count of the GGUF file the trainer converts."""
    from gguf import GGUFReader

    from finetune_trainer.model.builtin_models import SMOLLM2_GGUF, SMOLLM2_PACKAGE
    from finetune_trainer.model.gguf_import import packaged_file

    reader = GGUFReader(packaged_file(SMOLLM2_PACKAGE, SMOLLM2_GGUF))
    in_file = sum(int(tensor.n_elements) for tensor in reader.tensors)
    assert architecture_shape(catalogue_entry("smollm2-135m-instruct").config).total_params == in_file


def test_a_config_value_the_counter_cannot_use_is_named() -> None:
    config = catalogue_entry("qwen3-8b").config | {"hidden_size": "4096"}
    with pytest.raises(UnknownArchitectureError, match=r"'hidden_size' of this qwen3 model is '4096'"):
        architecture_shape(config)
    layers = catalogue_entry("qwen3-30b-a3b").config | {"mlp_layer_types": ["sparse", "dense"]}
    with pytest.raises(UnknownArchitectureError, match=r"'mlp_layer_types' .* each of the 48 layers"):
        architecture_shape(layers)


def test_half_of_a_fused_expert_weight_is_refused_as_peft_refuses_it() -> None:
    """transformers 5 fuses the experts' gate and up projections; peft cannot adapt one half."""
    shape = architecture_shape(catalogue_entry("qwen3-30b-a3b").config)
    with pytest.raises(UnknownArchitectureError, match="lists gate_proj without up_proj"):
        count_parameters(shape, 8, ["q_proj", "gate_proj"])
    both = count_parameters(shape, 8, ["gate_proj", "up_proj"])
    assert both.trainable == 48 * 128 * 16 * (2048 + 2 * 768)  # rank 2r on the fused [E, 2I, h] weight


def test_moe_layers_follow_the_config_interleave() -> None:
    """DeepSeek-style dense layers first (transformers ignores `moe_layer_freq`); Qwen's sparse step and dense
    list."""
    from finetune_operator.plan.counting.config_keys import ConfigView
    from finetune_operator.plan.counting.decoder_layout import moe_layer_count
    from finetune_operator.plan.counting.decoder_spec import MoeSpec

    deepseek = ConfigView({"first_k_dense_replace": 3, "moe_layer_freq": 2}, "deepseek_v3")
    assert moe_layer_count(MoeSpec(layers="first_k_dense"), deepseek, 10) == 7  # layers 3 to 9
    qwen = ConfigView({"decoder_sparse_step": 2, "mlp_only_layers": [3]}, "qwen2_moe")
    assert moe_layer_count(MoeSpec(layers="sparse_step"), qwen, 8) == 3  # layers 1, 5, 7 (3 is dense)


def test_a_head_scaled_by_the_class_default_keeps_the_full_logits() -> None:
    """Cohere's class scales the logits (logit_scale 0.0625) when its config.json leaves the key out: the
    trainer's loss then keeps the full logits (`output_head`), and so does the plan; Gemma 2's soft-cap
    likewise."""
    cohere = {"model_type": "cohere", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4}  # fmt: skip
    assert architecture_shape(cohere).full_logits
    assert not architecture_shape(cohere | {"logit_scale": 1.0}).full_logits
    gemma2 = {k: v for k, v in catalogue_entry("gemma-2-9b").config.items() if k != "final_logit_softcapping"}
    shape = architecture_shape(gemma2)
    assert shape.full_logits and shape.logit_softcapping
