"""Parameter counts from the real model classes, built on the meta device (no memory).

This is the ground truth the closed-form counts in `param_count.py` are held to, and
the model builder the traced estimator starts from. It needs torch, transformers and
peft, so it is imported only when they are installed (never by the operator image).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from finetune_operator.plan.counting.param_count import ALL_LINEAR


@dataclass(frozen=True)
class MetaCounts:
    base_total: int
    trainable: int
    total: int
    largest_layer: int


def build_config(config: dict[str, Any]) -> Any:
    """A transformers config object from a plain config.json mapping."""
    values = {key: value for key, value in config.items() if not key.startswith("_")}
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def build_meta_model(config: dict[str, Any], dtype: torch.dtype = torch.bfloat16) -> PreTrainedModel:
    """The model with every parameter on the meta device (shapes only)."""
    hf_config = build_config(config)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)  # type: ignore[no-untyped-call]
    return model  # type: ignore[no-any-return]


def apply_lora(
    model: PreTrainedModel, r: int, target_modules: Sequence[str], dropout: float = 0.0, alpha: int = 32
) -> Any:
    """Wrap the model with peft LoRA adapters as the trainer does.

    The adapters are made on the meta device too (peft's `low_cpu_mem_usage`): initialising
    them as CPU tensors took 4 of the 5 CPU seconds of a 70B model's count."""
    import peft

    targets: str | list[str] = ALL_LINEAR if ALL_LINEAR in target_modules else list(target_modules)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(model, lora, low_cpu_mem_usage=True)


def largest_module_params(model: torch.nn.Module) -> int:
    """Largest number of parameters owned directly by one module (DeepSpeed's "largest layer")."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def _unique_numel(parameters: Any) -> int:
    return sum({id(p): p.numel() for p in parameters}.values())


def count_on_meta(config: dict[str, Any], lora_r: int | None, target_modules: Sequence[str] = ()) -> MetaCounts:
    """Total, trainable and largest-layer counts of the real model (with LoRA when `lora_r` is set)."""
    model = build_meta_model(config)
    base_total = _unique_numel(model.parameters())
    largest = largest_module_params(model)
    if lora_r is None:
        return MetaCounts(base_total, base_total, base_total, largest)
    wrapped = apply_lora(model, lora_r, target_modules)
    params = list(wrapped.parameters())
    trainable = _unique_numel(p for p in params if p.requires_grad)
    return MetaCounts(base_total, trainable, _unique_numel(params), largest)
