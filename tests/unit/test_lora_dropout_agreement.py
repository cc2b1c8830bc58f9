"""The plan and the trainer agree on LoRA dropout for every family the planner counts.

peft adapts fused expert weights as parameters (no dropout) only where it re-targets the
family's experts. The trainer asks peft (`fused_expert_parameters`), the planner reads its weight
groups (`adapts_fused_experts`); both must say the same for each model_type, or the plan assumes
dropout masks the run does not keep (Gemma 3's 4-D vision convolution and gpt-oss's un-adapted
experts made the old trainer rule, "any parameter of 3 or more dimensions", force dropout to 0).
"""

from __future__ import annotations

import warnings

import pytest

from finetune_operator.plan.counting.meta_count import build_meta_model
from finetune_operator.plan.counting.param_count import architecture_shape
from finetune_operator.plan.errors import UnknownArchitectureError
from finetune_operator.plan.workload import adapts_fused_experts
from finetune_trainer.model.modeling import fused_expert_parameters
from tests.model_type_coverage import decoder_only_text_types, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TARGETS = (["all-linear"], ["q_proj", "v_proj"])


def test_plan_and_trainer_agree_on_which_families_adapt_fused_experts() -> None:
    checked: dict[str, bool] = {}
    for model_type in decoder_only_text_types():
        config = tiny_config(model_type)
        try:
            shape = architecture_shape(config)
        except UnknownArchitectureError:
            continue  # not counted: refused by name before any run
        if shape.num_experts == 1 and model_type not in ("gemma3", "llama", "qwen3"):
            continue  # a dense text decoder has nothing the two could disagree on (llama, qwen3 stand for them)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_meta_model(config)
        for targets in TARGETS:
            trainer = bool(fused_expert_parameters(model, targets[0] if targets == ["all-linear"] else targets))
            assert adapts_fused_experts(shape, targets) == trainer, (model_type, targets, trainer)
        checked[model_type] = adapts_fused_experts(shape, ["all-linear"])
    # the families the defect was about, and the ones whose experts peft does adapt
    assert checked["gemma3"] is False and checked["gpt_oss"] is False and checked["qwen3"] is False
    assert checked["qwen3_moe"] is True and checked["mixtral"] is True
    assert len(checked) >= 15, sorted(checked)
