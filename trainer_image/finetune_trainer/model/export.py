"""The artefacts a finished run leaves: the adapter (or full model) and optionally a merged model.

Under ZeRO-3 parameters are partitioned, so they are gathered one at a time (every rank
takes part, rank 0 keeps a CPU copy); nothing here needs the whole model on one GPU.
Everything is written in safetensors into a temporary folder and renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from finetune_operator.api.methods import MethodType, method_traits
from finetune_trainer.model.start_adapter import TRAINED


def gathered_state_dict(model: Any, rank: int, trainable_only: bool) -> dict[str, Any]:
    """Full tensors of the (trainable) parameters on rank 0; empty elsewhere."""
    import deepspeed

    state: dict[str, Any] = {}
    for name, param in model.named_parameters():
        if trainable_only and not param.requires_grad:
            continue
        if hasattr(param, "ds_id"):
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if rank == 0:
                    state[name] = param.detach().cpu().clone()
        elif rank == 0:
            state[name] = param.detach().cpu().clone()
    return state


def _swap_in(tmp: Path, final: Path) -> Path:
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def save_trained(model: Any, tokenizer: Any, out: Path, method: MethodType, rank: int) -> Path:
    """Adapter (lora/qlora) or full weights to `out`, collectively; returns the folder."""
    state = gather_trained(model, method, rank)
    return write_trained(model, tokenizer, out, state) if rank == 0 else out


def gather_trained(model: Any, method: MethodType, rank: int) -> dict[str, Any]:
    """Collective: the adapter's (lora/qlora) or the whole model's (full) tensors, on rank 0's host."""
    return gathered_state_dict(model, rank, trainable_only=method_traits(method).has_adapter)


def write_trained(model: Any, tokenizer: Any, out: Path, state: dict[str, Any]) -> Path:
    """Rank 0: the gathered tensors and the tokenizer into `out` (safetensors, swapped in whole)."""
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    extra: dict[str, Any] = {}
    if hasattr(model, "peft_config"):  # only the trained adapter, not a preference job's frozen start adapter
        extra["selected_adapters"] = [TRAINED]
    model.save_pretrained(str(tmp), state_dict=state, safe_serialization=True, **extra)
    tokenizer.save_pretrained(str(tmp))
    return _swap_in(tmp, out)


def save_merged(base_path: str, adapter_dir: Path, tokenizer: Any, out: Path, dtype_name: str) -> Path:
    """Base weights (unquantised) plus the adapter, merged (rank 0 only)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from finetune_trainer.model.pretrained import NO_HUB_KERNELS

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype_name), **NO_HUB_KERNELS)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    return _swap_in(tmp, out)
