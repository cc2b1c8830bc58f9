"""A plan taken literally from the spec, with no memory model.

Used where no choice is wanted (tests that pin a strategy) and as the fallback while
the real planner is absent: `auto` becomes ZeRO-2 without offload, micro-batch 1.
"""

from __future__ import annotations

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import PlanStatus


def fixed_plan(spec: FineTuneJobSpec) -> PlanStatus:
    """The strategy the spec names, with `auto` resolved to conservative defaults."""
    ds, training = spec.deepspeed, spec.training
    stage = 2 if ds.zero_stage == "auto" else int(ds.zero_stage)
    micro = 1 if training.micro_batch_size == "auto" else int(training.micro_batch_size)
    per_step = micro * spec.world_size
    accumulation = max(1, training.global_batch_size // per_step)
    offload_opt = "none" if ds.offload_optimizer == "auto" else str(ds.offload_optimizer)
    offload_par = "none" if ds.offload_params == "auto" else str(ds.offload_params)
    checkpointing = training.gradient_checkpointing == "true"
    return PlanStatus(
        zero_stage=stage,
        offload_optimizer=offload_opt,
        offload_params=offload_par,
        gradient_checkpointing=checkpointing,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        per_gpu_bytes=0,
        gpu_memory_bytes=spec.resources.gpu_memory_bytes,
        reason="fixed plan: taken from the spec without a memory estimate",
    )
