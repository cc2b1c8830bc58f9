"""The DeepSpeed JSON config a plan implies.

The plan owns batch sizes, ZeRO stage, offload and precision; the user's
`spec.deepspeed.overrides` (dotted keys, validated in the API) are merged on top.
"""

from __future__ import annotations

from typing import Any

from ..api.spec import FineTuneJobSpec
from ..api.status import PlanStatus

DEFAULT_NVME_PATH = "/local_nvme"
DEFAULT_BUCKET = 50_000_000
"""Elements of the reduce, all-gather and prefetch buckets (DeepSpeed's own defaults are 5e8)."""


def reduce_bucket(plan: PlanStatus) -> int:
    """The gradient reduce bucket: DeepSpeed allocates it whole (twice with `overlap_comm` at
    stages 1-2) whatever trains, so it is no larger than the trainable parameters (LoRA: a few
    million). Every trainable tensor fits, since each is part of that count."""
    trainable = plan.trainable_parameters
    return DEFAULT_BUCKET if trainable is None else max(1, min(DEFAULT_BUCKET, trainable))


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path or DEFAULT_NVME_PATH
    return block


def _set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def deepspeed_config(spec: FineTuneJobSpec, plan: PlanStatus) -> dict[str, Any]:
    """DeepSpeed config for this job under this plan (a pure function)."""
    precision = spec.training.precision
    world = spec.world_size
    zero: dict[str, Any] = {
        "stage": plan.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": reduce_bucket(plan),
        "allgather_bucket_size": DEFAULT_BUCKET,
    }
    if plan.zero_stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": DEFAULT_BUCKET,
                "stage3_param_persistence_threshold": 1e5,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    if plan.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(plan.offload_optimizer, spec.deepspeed.nvme_path)
    if plan.offload_params != "none":
        zero["offload_param"] = _offload(plan.offload_params, spec.deepspeed.nvme_path)
    config: dict[str, Any] = {
        "train_batch_size": plan.micro_batch_size * plan.gradient_accumulation_steps * world,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "gradient_clipping": spec.training.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    for key, value in sorted((spec.deepspeed.overrides or {}).items()):
        _set_dotted(config, key, value)
    return config
