"""A rank's preference objective on a real (tiny) LoRA model: the reference is the base with the
adapter off, a fresh adapter (B = 0) scores log 2, and only the adapter gets gradients."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from finetune_operator.api.methods import Objective, PreferenceLoss, ReferenceModel
from finetune_trainer.data.batching import Row, collate, example_rows
from finetune_trainer.model.objectives import Preference
from finetune_trainer.model.preference_loss import IGNORE_INDEX, completion_logps

VOCAB = 64


class Engine:
    """What the objective asks of DeepSpeed's engine: a forward, and the wrapped (peft) model."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)


def tiny_lora() -> tuple[Any, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    base = LlamaForCausalLM(config)
    frozen = copy.deepcopy(base)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return model, frozen


def pairs_batch() -> dict[str, Any]:
    """Two pairs: prompts of 3 tokens, answers of 2-4, as the sampler deals them (chosen first)."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for prompt_len, answer_len in ((3, 2), (3, 4), (3, 3), (3, 4)):
        ids = tuple(int(x) for x in torch.randint(1, VOCAB, (prompt_len + answer_len,), generator=g))
        labels = (IGNORE_INDEX,) * prompt_len + ids[prompt_len:]
        rows.append(Row(ids, labels, (len(ids),)))
    batch = collate(example_rows(rows, [0, 1], 2), pad_id=0)
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}


def dpo() -> Preference:
    return Preference(Objective.DPO, 0.1, PreferenceLoss.SIGMOID, ReferenceModel.ADAPTER_DISABLED)


def test_a_fresh_adapter_scores_log_two_against_its_own_base() -> None:
    model, _ = tiny_lora()
    step = dpo()(Engine(model), pairs_batch())
    assert step.weight == 2 and step.terms is not None
    assert float(step.loss.detach()) == pytest.approx(math.log(2), abs=1e-6)  # policy == reference: -log σ(0)
    assert step.terms.metrics()["reward_margin"] == pytest.approx(0.0, abs=1e-7)


def test_the_reference_is_the_base_without_the_adapter_and_only_the_adapter_learns() -> None:
    model, frozen = tiny_lora()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # an adapter that has learnt something
    inputs = pairs_batch()
    objective = dpo()
    model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
    reference = objective._reference_logps(Engine(model), model_inputs, inputs["labels"])
    with torch.no_grad():
        base_logits = frozen(**model_inputs).logits
    expected = completion_logps(base_logits, inputs["labels"])[0]
    assert torch.allclose(reference, expected, atol=1e-5)

    step = objective(Engine(model), inputs)
    assert abs(float(step.loss.detach()) - math.log(2)) > 1e-4
    step.loss.backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained and all("lora_" in n for n in trained)


def test_orpo_needs_no_reference_and_trains_the_adapter() -> None:
    model, _ = tiny_lora()
    orpo = Preference(Objective.ORPO, 0.1, PreferenceLoss.SIGMOID, ReferenceModel.NONE)
    step = orpo(Engine(model), pairs_batch())
    assert step.weight == 2 and torch.isfinite(step.loss)
    step.loss.backward()
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
