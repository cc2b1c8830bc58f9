"""Which weights peft's LoRA adapts on a loaded model, asked of peft itself.

Two things depend on it. LoRA dropout: peft adapts a mixture of experts' fused 3-D weights as
parameters (its ParamWrapper), where it has no dropout, but only for the families it re-targets
(Mixtral- and Qwen-MoE-style, through its transformers-v5 conversion); gpt-oss's experts, or a
vision tower's 4-D patch convolution, are never adapted, so they change nothing. The planner
applies the same rule from the config (`plan.workload.adapts_fused_experts`), and a test holds
the two to each other. And the report: `all-linear` adapts every `nn.Linear` and what peft
re-targets; the weights it leaves frozen (a MoE's experts and router peft does not support, a
projection that is a bare parameter) are logged and listed in the run's summary.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

MAX_REPORTED = 12
"""Groups of skipped weights listed in the summary (the termination message is small)."""


def param_wrapped(model: Any, lora_config: Any) -> list[str]:
    """Names of the parameters this LoRA config adapts through peft's ParamWrapper (fused experts)."""
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers

    probe = copy.deepcopy(lora_config)
    if isinstance(probe.target_modules, str) and probe.target_modules != "all-linear":
        return []
    convert_peft_config_for_transformers(probe, model=model, conversions=None)
    targets = set(getattr(probe, "target_parameters", None) or ())
    if not targets:
        return []
    return [name for name, _ in model.named_parameters() if any(name == t or name.endswith(f".{t}") for t in targets)]


def _shape(param: Any) -> tuple[int, ...]:
    return tuple(getattr(param, "ds_shape", None) or param.shape)


def not_adapted(peft_model: Any) -> list[str]:
    """Matrix weights `all-linear` left frozen, grouped by layer-free name: `model.layers.*.mlp.experts.down_proj (24)`.

    Embeddings and the output head are frozen by design and not listed; nor are norms (1-D) and biases."""
    import torch

    inner = peft_model.base_model.model
    modules = set(getattr(peft_model.base_model, "targeted_module_names", None) or ())
    params = set(getattr(peft_model.base_model, "targeted_parameter_names", None) or ())
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    frozen_modules = {name for name, m in inner.named_modules() if isinstance(m, torch.nn.Embedding) or m is head}
    groups: Counter[str] = Counter()
    for wrapped, param in inner.named_parameters():
        name = wrapped.replace(".base_layer", "")  # peft's wrappers keep the adapted module under base_layer
        owner = name.rsplit(".", 1)[0]
        if len(_shape(param)) < 2 or "lora_" in name or name.endswith("bias") or owner in frozen_modules:
            continue
        if name in params or owner in modules:
            continue
        groups[re.sub(r"\.\d+\.", ".*.", name)] += 1
    return [f"{name} ({count})" if count > 1 else name for name, count in sorted(groups.items())][:MAX_REPORTED]
