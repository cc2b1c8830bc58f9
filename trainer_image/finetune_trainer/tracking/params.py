"""What a job's MLflow run is described by: its params and tags, from the config a pod receives.

Params are the hyper-parameters and the first plan (MLflow keeps a param's first value); tags
say which job, image and version ran it, the plan now in force, and one `ftjob.replan.<n>` per
re-plan after an out-of-memory failure.
"""

from __future__ import annotations

from importlib import metadata

from finetune_operator.api.status import PlanStatus
from finetune_operator.api.strategy import Strategy
from finetune_trainer.settings import JobConfig


def describe_plan(plan: PlanStatus) -> str:
    return f"{Strategy.from_plan(plan)}, {plan.per_gpu_bytes / 2**30:.1f} GiB per GPU planned"


def operator_version() -> str:
    """The finetune-operator release the trainer image was built from (the operator's, in one install)."""
    try:
        return metadata.version("finetune-operator")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_params(cfg: JobConfig) -> dict[str, str]:
    spec, plan = cfg.job.spec, cfg.plan
    t = spec.training
    params: dict[str, object] = {
        "model": spec.model.uri,
        "method": spec.method.type,
        "dataset": spec.dataset.uri,
        "dataset.format": spec.dataset.format,
        "dataset.max_seq_length": spec.dataset.max_seq_length,
        "dataset.packing": spec.dataset.packing,
        "learning_rate": t.learning_rate,
        "lr_schedule": t.lr_schedule,
        "warmup": f"{t.warmup_steps} steps" if t.warmup_steps is not None else f"ratio {t.warmup_ratio or 0.03}",
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "precision": t.precision,
        "seed": t.seed,
        "global_batch_size": t.global_batch_size,
        "max_steps" if t.max_steps is not None else "epochs": t.max_steps if t.max_steps is not None else t.epochs or 1,
        "world_size": cfg.world_size,
        "plan.zero_stage": plan.zero_stage,
        "plan.offload_optimizer": plan.offload_optimizer,
        "plan.offload_params": plan.offload_params,
        "plan.micro_batch_size": plan.micro_batch_size,
        "plan.gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "plan.gradient_checkpointing": plan.gradient_checkpointing,
        "plan.per_gpu_bytes": plan.per_gpu_bytes,
        "plan.gpu_memory_bytes": plan.gpu_memory_bytes,
    }
    if spec.model.adapter is not None:  # the adapter this run trains on (a finished job's result)
        params["model.adapter"] = spec.model.adapter
    if plan.trainable_parameters is not None:
        params["plan.trainable_parameters"] = plan.trainable_parameters
    if spec.method.traits.has_adapter:
        lora = spec.method.lora_or_default
        params.update(
            {
                "lora.r": lora.r,
                "lora.alpha": lora.alpha,
                "lora.dropout": "default" if lora.dropout is None else lora.dropout,
                "lora.target_modules": ",".join(lora.target_modules),
            }
        )
    if spec.method.traits.base_quantized:
        qlora = spec.method.qlora_or_default
        params.update({"qlora.quant_type": qlora.quant_type, "qlora.double_quant": qlora.double_quant})
    if spec.method.objective_traits.preference:  # dpo, orpo: the adaptation and the loss's settings
        preference = spec.method.preference_or_default
        params.update(
            {
                "preference.base": spec.method.adaptation,
                "preference.beta": preference.beta,
                "preference.reference": spec.reference,
            }
        )
        if preference.loss_type is not None:
            params["preference.loss_type"] = preference.loss_type
    return {key: str(value)[:6000] for key, value in params.items()}


def run_tags(cfg: JobConfig, image: str) -> dict[str, str]:
    meta = cfg.job.metadata
    tags = {
        "ftjob.job": meta.name,
        "ftjob.namespace": meta.namespace or "",
        "ftjob.image": image,
        "ftjob.operator_version": operator_version(),
        "ftjob.plan": describe_plan(cfg.plan),
        "ftjob.replans": str(cfg.plan.replans),
    }
    return {key: value for key, value in tags.items() if value}


def replan_tags(plan: PlanStatus) -> dict[str, str]:
    """`ftjob.replan.<n>`: the plan the n-th re-plan chose and why (the tags of earlier ones stay)."""
    if not plan.replans:
        return {}
    return {f"ftjob.replan.{plan.replans}": f"{describe_plan(plan)}: {plan.replan_reason or 'out of memory'}"[:5000]}
