"""LoRA on a mixture of experts whose expert weights are fused 3-D tensors (Mixtral in transformers 5).

`all-linear` makes peft adapt those tensors through its ParamWrapper, which has no dropout: the
job's default dropout must become 0 there, and an explicit non-zero one must fail with a message
that names the field, not with peft's ValueError from inside a rank.
"""

from __future__ import annotations

from typing import Any

import pytest

from finetune_operator.api.job import FineTuneJob
from finetune_trainer import outcome
from finetune_trainer.model.modeling import LoraSettingError, _lora_config, fused_expert_parameters, lora_dropout
from tests.support.training_runs import job_manifest

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]


# peft's own notes while it adapts fused experts (its MoE rank pattern, a transformers deprecation)
PEFT_NOISE = [
    pytest.mark.filterwarnings("ignore:The following (rank|alpha)_pattern keys did not match:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.is_gradient_checkpointing. is deprecated"),
]


def _mixtral() -> Any:
    from transformers import AutoModelForCausalLM, MixtralConfig

    config = MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    return AutoModelForCausalLM.from_config(config)


def _spec(lora: dict[str, Any]) -> Any:
    manifest = job_manifest("/models/m", "/data/d.jsonl", "/out", method={"type": "lora", "lora": lora})
    return FineTuneJob.from_manifest(manifest).spec


def test_dropout_is_the_specs_else_the_default_else_zero_on_fused_experts() -> None:
    assert lora_dropout(None, []) == 0.05
    assert lora_dropout(0.1, []) == 0.1
    assert lora_dropout(0.0, []) == 0.0
    assert lora_dropout(None, ["model.layers.0.mlp.experts.gate_up_proj"]) == 0.0
    assert lora_dropout(0.0, ["model.layers.0.mlp.experts.gate_up_proj"]) == 0.0
    with pytest.raises(LoraSettingError) as caught:
        lora_dropout(0.05, ["model.layers.0.mlp.experts.gate_up_proj"])
    message = str(caught.value)
    assert message.startswith("spec.method.lora.dropout: 0.05 cannot apply") and "set it to 0" in message
    assert outcome.failure_line(caught.value, 0).startswith(f"{outcome.CONFIG_ERROR}: spec.method.lora.dropout")


@PEFT_NOISE[0]
@PEFT_NOISE[1]
def test_a_default_mixtral_lora_adapts_the_experts_without_dropout() -> None:
    from peft import get_peft_model

    model = _mixtral()
    fused = fused_expert_parameters(model, "all-linear")
    # peft re-targets the fused 3-D expert weights (and, from 0.21.2, the router's bare weight) as parameters
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"} <= set(fused), fused
    assert all(name.startswith("model.layers.0.mlp.") for name in fused), fused
    assert fused_expert_parameters(model, ["q_proj", "v_proj"]) == []
    config = _lora_config(_spec({"r": 4, "alpha": 8}), model)
    assert config.lora_dropout == 0.0
    peft_model = get_peft_model(model, config)
    adapted = [n for n, p in peft_model.named_parameters() if p.requires_grad and "lora_" in n]
    assert any(".experts." in n for n in adapted), adapted


@PEFT_NOISE[0]
@PEFT_NOISE[1]
def test_peft_still_refuses_dropout_on_fused_experts() -> None:
    """The reason for the rule above; when peft learns it, this fails and the rule can go."""
    from peft import LoraConfig, get_peft_model

    with pytest.raises(ValueError, match="lora_dropout"):
        get_peft_model(_mixtral(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules="all-linear"))


def test_an_explicit_dropout_on_fused_experts_fails_with_the_field_and_a_dense_model_keeps_it() -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    with pytest.raises(LoraSettingError, match=r"^spec\.method\.lora\.dropout: 0\.1 "):
        _lora_config(_spec({"r": 4, "alpha": 8, "dropout": 0.1}), _mixtral())
    attention_only = _spec({"r": 4, "alpha": 8, "dropout": 0.1, "targetModules": ["q_proj"]})
    assert _lora_config(attention_only, _mixtral()).lora_dropout == 0.1
    dense = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                                         num_hidden_layers=1, num_attention_heads=4))  # fmt: skip
    assert fused_expert_parameters(dense, "all-linear") == []
    assert _lora_config(_spec({"r": 4, "alpha": 8}), dense).lora_dropout == 0.05
