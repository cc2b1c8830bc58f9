"""Loading the base model and tokenizer, and wrapping them for LoRA, QLoRA or full tuning.

Precision policy: a rank computes in the job's precision, on GPU and on CPU alike, so the
CPU tiers run the optimizer wrappers a GPU run uses (ZeRO-0's 16-bit optimizer with its fp32
masters, ZeRO 1-3's fp32 partitions). DeepSpeed's CPU accelerator and torch run bf16 on any
x86 CPU (natively with AVX512-BF16/AMX). Only fp16 can be missing: DeepSpeed's CPU accelerator
accepts it where oneDNN has fp16 kernels, and refuses it elsewhere ("Type fp16 is not supported
on your device"). There the rank computes in bf16, the other 16-bit type, which keeps the
same 16-bit weights, fp32 masters and optimizer wrappers (only fp16's loss scaling is not
exercised); the in-memory DeepSpeed config follows, and the run logs which and why.
QLoRA keeps its 4-bit NF4 storage on CPU.
Under ZeRO-3, QLoRA stores the packed 4-bit weights in the compute dtype so DeepSpeed
can partition them together with the other parameters (peft's DeepSpeed guidance).
The 4-bit layers keep that layout for the whole run: see `keep_4bit_training_layout`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_operator.api.lora_rules import UnsupportedSetting, resolve_lora_dropout
from finetune_operator.api.methods import MethodType, ReferenceModel, method_traits
from finetune_operator.api.model_uri import hub_model
from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.pod_env import PodEnv
from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import PlanStatus
from finetune_trainer.errors import TrainerError
from finetune_trainer.model import builtin_models, start_adapter
from finetune_trainer.model.pretrained import NO_HUB_KERNELS
from finetune_trainer.settings import ConfigError
from finetune_trainer.storage import paths
from finetune_trainer.storage.paths import resolve_uri

log = logging.getLogger(__name__)

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class ModelNotFound(TrainerError, RuntimeError):
    """The model URI points nowhere usable; the message says where it looked."""

    reason = TerminationReason.MODEL_NOT_FOUND


@dataclass(frozen=True)
class ComputeSettings:
    dtype_name: str
    on_gpu: bool
    attn_implementation: str
    note: str = ""
    """Why the dtype is not the job's precision (a fallback the run logs), or empty."""

    @property
    def precision(self) -> str:
        """The precision this rank runs, in `training.precision`'s words (bf16, fp16, fp32)."""
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype_name)


def cpu_supports_fp16() -> bool:
    """Whether DeepSpeed's CPU accelerator accepts fp16 here (oneDNN fp16 kernels: AVX512-FP16 or AMX-FP16)."""
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


CPU_FP16_FALLBACK = (
    "training.precision=fp16, but DeepSpeed's CPU accelerator refuses fp16 on this CPU (\"Type fp16 is not "
    'supported on your device": oneDNN has no fp16 kernels without AVX512-FP16 or AMX-FP16): computing in bf16, '
    "the other 16-bit type, with the same 16-bit weights, fp32 master weights and optimizer wrappers; "
    "fp16's loss scaling is not exercised on this CPU"
)


def compute_settings(spec: FineTuneJobSpec, on_gpu: bool, cpu_fp16: bool | None = None) -> ComputeSettings:
    """The dtype and attention kernel this rank uses, and why. `cpu_fp16`: whether the CPU runs
    fp16 (asked of DeepSpeed's accelerator when None). The kernel is SDPA on CPU and GPU alike, with
    an explicit mask for padded and packed rows: the image has no varlen flash-attention kernel,
    and the planner counts the masks (`plan.activations`)."""
    asked = str(spec.training.precision)
    if not on_gpu:
        if asked == "fp16" and not (cpu_supports_fp16() if cpu_fp16 is None else cpu_fp16):
            return ComputeSettings(DTYPES["bf16"], False, "sdpa", CPU_FP16_FALLBACK)
        return ComputeSettings(DTYPES[asked], False, "sdpa")
    return ComputeSettings(DTYPES[asked], True, "sdpa")


def effective_deepspeed_config(config: dict[str, Any], compute: ComputeSettings) -> dict[str, Any]:
    """The rendered config adjusted to this machine (only when running on CPU): the precision
    this rank computes in (see `compute_settings`), and the client AdamW accepted under offload."""
    out = dict(config)
    if not compute.on_gpu:
        out["bf16"] = {**out.get("bf16", {}), "enabled": compute.precision == "bf16"}
        out["fp16"] = {**out.get("fp16", {}), "enabled": compute.precision == "fp16"}
        out["zero_force_ds_cpu_optimizer"] = False
    return out


def model_path(uri: str, cache_root: Path, seed: int) -> str:
    """A local directory (generated for builtin://) or a hub id, checked early with a clear message."""
    if paths.is_builtin(uri):
        try:
            return str(builtin_models.materialise_model(paths.builtin_name(uri), cache_root, seed))
        except FileNotFoundError as exc:
            raise ModelNotFound(str(exc)) from None
    local = resolve_uri(uri)
    if local is None:
        hub = hub_model(uri)
        return hub.repo if hub is not None else uri
    path = Path(local)
    if not path.exists():
        raise ModelNotFound(f"model.uri {uri}: path {path} does not exist (is the volume mounted?)")
    if not (path / "config.json").exists():
        raise ModelNotFound(f"model.uri {uri}: {path} has no config.json (not a transformers model folder)")
    return str(path)


def model_revision(spec: FineTuneJobSpec) -> str | None:
    """The hub revision the job pins (`model.revision`, or the uri's `@revision`)."""
    hub = hub_model(spec.model.uri, spec.model.revision)
    return hub.revision if hub is not None else spec.model.revision


def load_tokenizer(path: str, spec: FineTuneJobSpec, cache_root: Path) -> Any:
    from transformers import AutoTokenizer

    source = path
    if spec.model.tokenizer:
        source = model_path(spec.model.tokenizer, cache_root, spec.training.seed)
    try:
        tok = AutoTokenizer.from_pretrained(
            source,
            revision=model_revision(spec) if source == path else None,
            trust_remote_code=spec.model.trust_remote_code,
            token=os.environ.get(PodEnv.HF_TOKEN),
        )
    except OSError as exc:
        raise ModelNotFound(f"cannot load tokenizer from {source}: {exc}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


class LoraSettingError(ConfigError):
    """The LoRA settings cannot apply to this model; the message names the field and what is allowed."""


def fused_expert_parameters(model: Any, targets: Any) -> list[str]:
    """Parameters LoRA on `targets` adapts through peft's ParamWrapper: the fused expert weights peft
    re-targets for this model's family (never gpt-oss's experts or a vision tower's 4-D convolution,
    which it leaves alone). peft itself answers (`lora_targets.param_wrapped`)."""
    from peft import LoraConfig

    from finetune_trainer.model.lora_targets import param_wrapped

    return param_wrapped(model, LoraConfig(r=1, target_modules=targets, task_type="CAUSAL_LM"))


def lora_dropout(requested: float | None, fused_experts: list[str]) -> float:
    """The planner's rule (`resolve_lora_dropout`) on the loaded model's own parameters."""
    where = None
    if fused_experts:
        where = f"this model's fused expert weights ({fused_experts[0]}, {len(fused_experts)} in all)"
    try:
        dropout = resolve_lora_dropout(requested, where)
    except UnsupportedSetting as exc:
        raise LoraSettingError(str(exc)) from None
    if fused_experts and requested is None:
        log.info("LoRA dropout 0: the targets include %d fused expert weights, where peft has no dropout",
                 len(fused_experts))  # fmt: skip
    return dropout


def _lora_config(spec: FineTuneJobSpec, model: Any) -> Any:
    from peft import LoraConfig

    lora = spec.method.lora_or_default
    targets: Any = "all-linear" if list(lora.target_modules) == ["all-linear"] else list(lora.target_modules)
    extra: dict[str, Any] = {}
    if paths.is_builtin(spec.model.uri) and paths.builtin_name(spec.model.uri) == builtin_models.TINY_LLAMA:
        # A random base has no useful embeddings to keep frozen; the demo trains them.
        # (A pretrained built-in keeps its embeddings frozen like any real model.)
        extra["modules_to_save"] = ["embed_tokens", "lm_head"]
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora_dropout(lora.dropout, fused_expert_parameters(model, targets)),
        target_modules=targets,
        task_type="CAUSAL_LM",
        **extra,
    )


def lora_skipped(model: Any, spec: FineTuneJobSpec) -> list[str]:
    """What `all-linear` left frozen on this model (a MoE's experts peft does not adapt), logged once."""
    lora = spec.method.lora_or_default
    if not spec.method.traits.has_adapter or list(lora.target_modules) != ["all-linear"]:
        return []
    from finetune_trainer.model.lora_targets import not_adapted

    skipped = not_adapted(model)
    if skipped and int(os.environ.get(PodEnv.RANK, "0")) == 0:
        log.warning("LoRA all-linear adapts what peft supports; left frozen: %s", "; ".join(skipped))
    return skipped


def zero3_loading(plan: PlanStatus, method: MethodType, ds_config: dict[str, Any] | None) -> Any:
    """transformers' DeepSpeed ZeRO-3 integration for `from_pretrained`, or None where it does not apply.

    While the returned HfDeepSpeedConfig is alive (transformers keeps only a weak reference),
    `from_pretrained` builds the model inside `deepspeed.zero.Init`: each parameter is
    partitioned as it is created and the checkpoint is loaded shard by shard, so no rank ever
    holds the whole model (8 ranks of a 70B pod would otherwise each hold 140 GB of host
    memory while loading). Not for QLoRA: bitsandbytes quantises whole tensors on load.
    """
    if ds_config is None or plan.zero_stage != 3 or method_traits(method).base_quantized:
        return None
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)  # type: ignore[no-untyped-call]


def partition_report(model: Any) -> tuple[int, int, int, int]:
    """(partitioned parameters, parameters, elements this rank holds, elements in full)."""
    partitioned = count = local = full = 0
    for param in model.parameters():
        count += 1
        numel = int(getattr(param, "ds_numel", param.numel()))
        full += numel
        shard = getattr(param, "ds_tensor", None)
        if shard is not None:
            partitioned += 1
            local += int(shard.numel())
        else:
            local += int(param.numel())
    return partitioned, count, local, full


def quantization_config(spec: FineTuneJobSpec, plan: PlanStatus, dtype: Any) -> Any:
    """bitsandbytes' 4-bit settings for a QLoRA job whose floating-point weights are `dtype`.

    Under ZeRO-3 the packed 4-bit weights are stored in `dtype` itself: DeepSpeed partitions and
    casts every floating-point parameter to the engine's precision, so a storage dtype other than
    that one (such as `qlora.computeDtype` float16 in a bfloat16 job) would be converted as if it
    held numbers, and the packed bits would be lost. Below ZeRO-3 they stay uint8, which DeepSpeed
    leaves alone. The matmuls run in `qlora.computeDtype`, else in `dtype`."""
    import torch
    from transformers import BitsAndBytesConfig

    q = spec.method.qlora_or_default
    compute_dtype = getattr(torch, q.compute_dtype) if q.compute_dtype else dtype
    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type=str(q.quant_type),
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_quant_storage=dtype if plan.zero_stage == 3 else torch.uint8,
    )


def load_model(
    spec: FineTuneJobSpec,
    plan: PlanStatus,
    path: str,
    compute: ComputeSettings,
    ds_config: dict[str, Any] | None = None,
) -> Any:
    """The model ready for `deepspeed.initialize`: adapters attached, checkpointing set.

    `ds_config` (the effective DeepSpeed config) lets ZeRO-3 build the model partitioned.
    """
    import torch

    dtype = getattr(torch, compute.dtype_name)
    traits = spec.method.traits
    model = _pretrained(spec, plan, path, compute, ds_config)
    if traits.base_quantized:
        keep_4bit_training_layout(model)
        freeze_4bit_base(model, plan.gradient_checkpointing)
    elif plan.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if traits.has_adapter:
        from peft import get_peft_model

        if spec.model.adapter is not None:  # a finished job's adapter trains on (DPO after SFT)
            with_reference = spec.reference is ReferenceModel.START_ADAPTER
            model = start_adapter.attach(model, spec, with_reference=with_reference)
        else:
            model = get_peft_model(model, _lora_config(spec, model))
        if plan.zero_stage == 3 and not traits.base_quantized and dtype in (torch.bfloat16, torch.float16):
            uniform_trainable_dtype(model, dtype)
        if spec.reference is ReferenceModel.START_ADAPTER:
            start_adapter.match_reference_dtype(model)
    else:
        for param in model.parameters():
            param.requires_grad_(True)
    return model


def load_reference(
    spec: FineTuneJobSpec, plan: PlanStatus, path: str, compute: ComputeSettings, ds_config: dict[str, Any] | None
) -> Any:
    """A frozen copy of the base model (full-model DPO's reference): loaded like the policy (partitioned
    at load under ZeRO-3), every weight frozen, in eval mode. It is the base a job started from, not a
    checkpoint: a resumed or re-planned job compares against the same reference."""
    model = _pretrained(spec, plan, path, compute, ds_config)
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()


def _pretrained(
    spec: FineTuneJobSpec, plan: PlanStatus, path: str, compute: ComputeSettings, ds_config: dict[str, Any] | None
) -> Any:
    """The checkpoint at `path` as transformers loads it for this job: its dtype, quantized where the
    method says, partitioned at load under ZeRO-3, without the generation cache."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, compute.dtype_name)
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": compute.attn_implementation,
        "revision": model_revision(spec),
        "trust_remote_code": spec.model.trust_remote_code,
        "token": os.environ.get(PodEnv.HF_TOKEN),
        **NO_HUB_KERNELS,
    }
    method, traits = spec.method.adaptation, spec.method.traits
    if traits.base_quantized:
        kwargs["quantization_config"] = quantization_config(spec, plan, dtype)
        kwargs["device_map"] = {"": _local_device(compute)}
    zero3 = zero3_loading(plan, method, ds_config)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ModelNotFound(f"cannot load model from {path}: {exc}") from None
    finally:
        del zero3  # only loading is partitioned this way; later from_pretrained calls (the merged export) are not
    if plan.zero_stage == 3:
        partitioned, count, local, full = partition_report(model)
        log.info(
            "ZeRO-3 load: %d of %d parameters partitioned at load; this rank holds %d of %d elements",
            partitioned,
            count,
            local,
            full,
        )
    model.config.use_cache = False
    return model


def freeze_4bit_base(model: Any, gradient_checkpointing: bool) -> None:
    """Freeze a 4-bit base for LoRA: peft's `prepare_model_for_kbit_training` without its fp32 copies.

    peft's preparation also casts every weight it did not quantise (embeddings, the head, norms) to
    fp32. Under DeepSpeed that buys nothing (`deepspeed.initialize` casts parameters back to the
    job's 16-bit precision), but it costs their size twice over while the model loads: for a 70B
    QLoRA job at ZeRO-3, which loads the whole model on every GPU, about 4 GiB more at load
    (`plan.memory.load_peak_bytes` counts what remains)."""
    for param in model.parameters():
        param.requires_grad_(False)
    if gradient_checkpointing:
        model.enable_input_require_grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def uniform_trainable_dtype(model: Any, dtype: Any) -> None:
    """Give every trainable parameter of a 16-bit ZeRO-3 LoRA model the compute dtype.

    peft keeps adapter weights in fp32 beside a bf16 base (`autocast_adapter_dtype`), while the
    copies of `modules_to_save` (the demo's embeddings and head) stay bf16. ZeRO-3 flattens the
    trainable partitions into one buffer and refuses mixed dtypes (`assert len(set(t.dtype for t
    in tensors)) == 1` in `deepspeed.runtime.zero.utils.defragment`), so a bf16 ZeRO-3 LoRA job
    with trained embeddings failed in `deepspeed.initialize` (the OOM re-plan to ZeRO-3 looped on
    it). ZeRO-0 to 2 get the same result from DeepSpeed, which casts the whole module to the
    16-bit dtype; the fp32 masters live in the optimizer either way.
    """
    for param in model.parameters():
        if param.requires_grad and param.dtype != dtype and not hasattr(param, "ds_id"):
            param.data = param.data.to(dtype)


def keep_4bit_training_layout(model: Any) -> None:
    """Stop bitsandbytes repacking the 4-bit base for CPU inference.

    On a CPU with AVX512-BF16, the first forward of a `Linear4bit` in eval mode without
    gradients (the trainer's evaluation) rewrites its weight into a layout for a bf16 inference
    kernel, rounds its absmax to bf16 and flags the quant state. The rewrite is one-way while
    training: every later forward, in training too, takes the inference kernel, which passes no
    gradient back through the frozen base. A run that evaluates before its first step (a fresh
    one) then trains another model than one that resumes without evaluating first: the loss moves
    by ~5e-5 and the LoRA gradients by ~80 % (tests/trainer/test_qlora_layout.py). Under ZeRO-3
    the rewrite replaces the data of a partitioned parameter, which DeepSpeed's next gather
    brings back in the original layout under the flagged quant state: fresh ZeRO-2 and ZeRO-3
    runs computed different first-step losses (6.2678 vs 6.2308), and with this the same one
    (tests/trainer/test_replan_resume_ladder.py, chain "qlora"). Inputs on a GPU never repack.
    """
    from bitsandbytes.nn.modules import Linear4bit

    for layer in model.modules():
        if isinstance(layer, Linear4bit):
            layer.support_avx512bf16_for_cpu = False


def _local_device(compute: ComputeSettings) -> str:
    if not compute.on_gpu:
        return "cpu"
    return f"cuda:{int(os.environ.get(PodEnv.LOCAL_RANK, '0'))}"


def trainable_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts, using ZeRO-3's full sizes when partitioned."""
    trainable = total = 0
    for param in model.parameters():
        n = int(getattr(param, "ds_numel", param.numel()))
        total += n
        trainable += n if param.requires_grad else 0
    return trainable, total
