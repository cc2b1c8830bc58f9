"""Every decoder-only text model_type of the installed transformers: counted exactly, or refused by name.

For each entry of the causal-LM mapping the planner's closed-form counts (total, LoRA
trainable on `all-linear` and on `q_proj, v_proj`, largest module) must equal those of the
real model class built on the meta device with peft applied, for a tiny config, for the same
config with its optional parts switched the other way, and for it without the keys equal to
the class's defaults; or the planner must refuse the model_type with a message that names it.
A wrong number is the one outcome not allowed.
"""

from __future__ import annotations

from functools import cache

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.model_type_coverage import (
    EXCLUDED,
    VARIANTS,
    Coverage,
    causal_lm_types,
    check,
    decoder_only_text_types,
)

NAMED_IN_THE_ISSUE = (
    "llama", "mistral", "mixtral", "qwen2", "gemma2", "phi3",  # the six counted before
    "qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2", "granite", "gpt_oss", "deepseek_v3", "deepseek_v2",
)  # fmt: skip
EXACT_FLOOR = 40


@cache
def _checked(model_type: str) -> tuple[Coverage, ...]:
    return tuple(check(model_type, variant) for variant in VARIANTS)


def _assert_exact_or_refused(model_type: str) -> str:
    plain, *others = _checked(model_type)
    for result in (plain, *others):
        assert result.status != "wrong", f"{model_type}: {result.detail}"
        if result.status == "refused":
            assert model_type in result.detail
    assert plain.status in ("exact", "refused", "excluded"), f"{model_type}: {plain.status} {plain.detail}"
    if plain.status == "exact":  # every variant exact (or one transformers itself cannot build)
        assert all(other.status in ("exact", "unbuildable") for other in others), others
    return plain.status


@pytest.mark.parametrize(
    "model_type",
    [pytest.param(t, marks=() if t in ("qwen3_moe", "gemma3") else pytest.mark.slow) for t in NAMED_IN_THE_ISSUE],
)
def test_the_families_users_name_are_counted_exactly(model_type: str) -> None:
    assert _assert_exact_or_refused(model_type) == "exact"


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("model_type", causal_lm_types())
def test_every_causal_lm_type_is_counted_exactly_or_refused_by_name(model_type: str) -> None:
    status = _assert_exact_or_refused(model_type)
    if model_type in EXCLUDED:
        assert status == "excluded"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_at_least_forty_decoder_only_text_types_are_exact() -> None:
    types = decoder_only_text_types()
    exact = [t for t in types if _assert_exact_or_refused(t) == "exact"]
    print(f"\n{len(exact)} of {len(types)} decoder-only text model_types exact")  # docs/guides/planner.md's line
    assert len(exact) >= EXACT_FLOOR
    assert set(NAMED_IN_THE_ISSUE) <= set(exact)


def test_an_encoder_is_refused_by_name_not_counted() -> None:
    """An encoder in the causal-LM mapping (BERT's LM head) is not a family the planner pretends to count."""
    from finetune_operator.plan.counting.param_count import architecture_shape
    from finetune_operator.plan.errors import UnknownArchitectureError

    with pytest.raises(UnknownArchitectureError, match="'bert'"):
        architecture_shape({"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4})


def test_what_a_config_leaves_out_is_the_configuration_class_default() -> None:
    """The counter's table of defaults is transformers' own, for every family it counts."""
    from transformers import SiglipVisionConfig

    from finetune_operator.plan.counting.families import FAMILIES
    from finetune_operator.plan.counting.family_defaults import FAMILY_DEFAULTS
    from finetune_operator.plan.counting.vision_towers import SIGLIP_DEFAULTS
    from tests.model_type_coverage import config_class_defaults

    assert set(FAMILY_DEFAULTS) == set(FAMILIES)
    for model_type in FAMILIES:
        assert FAMILY_DEFAULTS[model_type] == config_class_defaults(model_type), model_type
    vision = SiglipVisionConfig()
    assert {key: getattr(vision, key) for key in SIGLIP_DEFAULTS} == SIGLIP_DEFAULTS


def test_gemma3_as_published_counts_like_the_model_transformers_builds() -> None:
    """google/gemma-3-4b-pt's config.json as published: text_config names only what differs from the defaults."""
    from finetune_operator.plan.counting.meta_count import count_on_meta
    from finetune_operator.plan.counting.param_count import architecture_shape
    from finetune_operator.plan.sources.model_source import catalogue_entry

    config = catalogue_entry("gemma-3-4b").config
    omitted = ("num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "vocab_size")
    text = {k: v for k, v in config["text_config"].items() if k not in omitted} | {"num_hidden_layers": 2}
    published = config | {"text_config": text, "vision_config": config["vision_config"] | {"num_hidden_layers": 1}}
    assert architecture_shape(published).total_params == count_on_meta(published, None).base_total
