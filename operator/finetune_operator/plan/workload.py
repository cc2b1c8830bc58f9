"""Everything about a job that memory depends on, gathered once from its spec.

A `Workload` is the planner's view of a FineTuneJob: the architecture and parameter
counts, the method and the weight groups its LoRA adapts (with their ranks), precision,
sequence length, batch, the GPU layout and the DeepSpeed bucket sizes the rendered config
will use. The estimators take a workload and a strategy and never look at the spec again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import wraps
from typing import TypeVar

from finetune_operator.api.base import quantity_bytes
from finetune_operator.api.lora_rules import UnsupportedSetting, resolve_lora_dropout
from finetune_operator.api.methods import (
    MethodTraits,
    MethodType,
    Objective,
    ObjectiveTraits,
    ReferenceModel,
    method_traits,
    objective_traits,
    reference_model,
)
from finetune_operator.api.spec import DEFAULT_LORA_DROPOUT, FineTuneJobSpec
from finetune_operator.plan.counting.param_count import (
    ArchitectureShape,
    ParameterCounts,
    WeightGroup,
    architecture_shape,
    count_parameters,
    is_adapted,
    lora_rank,
)
from finetune_operator.plan.errors import InvalidModelError, PlanningError, UnsupportedSettingError
from finetune_operator.plan.sources.model_files import not_causal
from finetune_operator.plan.sources.model_source import ModelSource, resolve_model

GIB = 2**30
RUNTIME_OVERHEAD_BYTES = 1 * GIB
"""CUDA context, cuBLAS and NCCL workspaces per GPU."""
DEFAULT_FIT_MARGIN = 0.90
"""Plan to this fraction of the card: the allocator's fragmentation needs the rest."""
HOST_BASELINE_PER_RANK = 3 * GIB
"""A rank's host footprint before offload: interpreter, libraries, data loader, pinned staging."""
NF4_DOUBLE_QUANT_BYTES = (4 + 8 / 64 + 32 / (64 * 256)) / 8
NF4_PLAIN_BYTES = 4.5 / 8
DEFAULT_SUB_GROUP_SIZE = 1_000_000_000


T = TypeVar("T")


def per_workload(term: Callable[[Workload], T]) -> Callable[[Workload], T]:
    """Compute a term of a workload once: the planner evaluates ~100 strategies of one
    workload, and terms that depend on the workload alone were most of its time.

    The value lives in the (frozen) instance's own `__dict__`, like `functools.cached_property`:
    it goes with the instance, and `replace()` (another workload) starts without it. Hashing
    the workload to key a shared cache would cost as much as the term.
    """
    slot = f"_term_{term.__module__}.{term.__qualname__}"

    @wraps(term)
    def cached(workload: Workload) -> T:
        memo = workload.__dict__
        if slot not in memo:
            memo[slot] = term(workload)
        value: T = memo[slot]
        return value

    return cached


@dataclass(frozen=True)
class DeepSpeedBuffers:
    """Element counts of DeepSpeed's communication buffers, as the rendered config sets them."""

    reduce_bucket: int
    allgather_bucket: int
    prefetch_bucket: int
    persistence_threshold: int
    sub_group_size: int


@dataclass(frozen=True)
class AdaptedGroup:
    """A weight group the job's LoRA adapts, and the rank peft gives it there."""

    group: WeightGroup
    rank: int


def adapted_groups(
    shape: ArchitectureShape, method: MethodType, lora_r: int, target_modules: Sequence[str]
) -> tuple[AdaptedGroup, ...]:
    """The weight groups LoRA with rank `lora_r` on `target_modules` adapts: none in full fine-tuning."""
    if method_traits(method).base_trains:
        return ()
    return tuple(AdaptedGroup(g, lora_rank(g, lora_r)) for g in shape.groups if is_adapted(g, target_modules))


@dataclass(frozen=True)
class Workload:
    """A job as the estimators see it."""

    source: ModelSource
    shape: ArchitectureShape
    counts: ParameterCounts
    method: MethodType
    lora_r: int
    target_modules: tuple[str, ...]
    lora_dropout: float
    param_bytes: int
    mixed_precision: bool
    seq_len: int
    global_batch: int
    num_nodes: int
    ranks_per_node: int
    quantized_bytes_per_param: float
    buffers: DeepSpeedBuffers
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES
    host_memory_bytes: int | None = None
    on_cpu: bool = False
    packing: bool = False
    merged_export: bool = False
    """`output.mergedModel`: rank 0 loads the unquantised base at the end and merges the adapter in."""
    objective: Objective = Objective.SFT
    """What the weights are trained towards (`method.type` dpo and orpo; sft otherwise): a preference
    pair is two sequences."""
    precompute_reference: bool = False
    """`method.preference.precomputeReference`: full DPO's reference log-probabilities computed beforehand."""
    start_adapter: bool = False
    """`model.adapter`: the job trains on an adapter it loads; a preference objective keeps that
    adapter, frozen, as its reference."""
    adapted: tuple[AdaptedGroup, ...] = field(init=False, repr=False, compare=False)
    """The weight groups LoRA adapts, with their ranks (none in full fine-tuning): resolved from the
    method, rank and targets once per workload, `replace()` and `with_method` included."""

    def __post_init__(self) -> None:
        adapted = adapted_groups(self.shape, self.method, self.lora_r, self.target_modules)
        object.__setattr__(self, "adapted", adapted)

    @property
    def traits(self) -> MethodTraits:
        """What the job's method trains and how it holds the frozen part (api.methods)."""
        return method_traits(self.method)

    @property
    def objective_traits(self) -> ObjectiveTraits:
        """What the job's objective reads and needs (api.methods)."""
        return objective_traits(self.objective)

    @property
    def reference(self) -> ReferenceModel:
        """The reference model beside the policy (none, the adapter-less base, a frozen copy, precomputed)."""
        return reference_model(self.method, self.objective, self.precompute_reference, self.start_adapter)

    @property
    def sequences_per_step_example(self) -> int:
        """Sequences one example of `microBatchSize` puts through the model (a preference pair: 2)."""
        return self.objective_traits.sequences_per_example

    @property
    def adapts_experts(self) -> bool:
        """Whether LoRA adapts fused expert weights (peft wraps them as parameters and materialises `W + B·A`)."""
        return any(a.group.kind == "experts" for a in self.adapted)

    @property
    def device(self) -> str:
        """What one rank runs on, in the words messages use: `GPU` or `CPU rank`."""
        return "CPU rank" if self.on_cpu else "GPU"

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def per_rank_batch(self) -> int:
        return max(1, self.global_batch // self.world_size)

    def with_world(self, num_nodes: int, ranks_per_node: int) -> Workload:
        return replace(self, num_nodes=num_nodes, ranks_per_node=ranks_per_node)

    def with_seq_len(self, seq_len: int) -> Workload:
        return replace(self, seq_len=seq_len)

    def with_method(self, method: MethodType) -> Workload:
        """The same job fine-tuned another way (lora, qlora or full)."""
        base_trains = method_traits(method).base_trains
        lora_r = None if base_trains else self.lora_r
        counts = count_parameters(self.shape, lora_r, self.target_modules)
        dropout = 0.0 if base_trains else (self.lora_dropout or DEFAULT_LORA_DROPOUT)
        return replace(self, method=method, counts=counts, lora_dropout=dropout)


RENDERED_BUCKET_DEFAULTS = {
    "zero_optimization.reduce_bucket_size": 5e7,
    "zero_optimization.allgather_bucket_size": 5e7,
    "zero_optimization.stage3_prefetch_bucket_size": 5e7,
    "zero_optimization.stage3_param_persistence_threshold": 1e5,
    "zero_optimization.sub_group_size": float(DEFAULT_SUB_GROUP_SIZE),
}
"""The bucket sizes `render/deepspeed_config.py` writes (plan must not import render); it writes
a reduce bucket of min(5e7, trainable parameters), which `memory._buffer_bytes` applies."""


def _buffers(spec: FineTuneJobSpec) -> DeepSpeedBuffers:
    """Bucket sizes of the rendered config, with the user's dotted overrides applied."""
    overrides = spec.deepspeed.overrides or {}

    def size(key: str) -> int:
        value = overrides.get(key, RENDERED_BUCKET_DEFAULTS[key])
        return int(float(value)) if not isinstance(value, bool) else int(RENDERED_BUCKET_DEFAULTS[key])

    return DeepSpeedBuffers(
        reduce_bucket=size("zero_optimization.reduce_bucket_size"),
        allgather_bucket=size("zero_optimization.allgather_bucket_size"),
        prefetch_bucket=size("zero_optimization.stage3_prefetch_bucket_size"),
        persistence_threshold=size("zero_optimization.stage3_param_persistence_threshold"),
        sub_group_size=size("zero_optimization.sub_group_size"),
    )


def adapts_fused_experts(shape: ArchitectureShape, target_modules: Sequence[str]) -> bool:
    """Whether LoRA on these targets adapts fused expert weights, which peft wraps as parameters
    (its ParamWrapper, without dropout): only where peft re-targets the family's experts
    (Mixtral- and Qwen-MoE-style), never gpt-oss's, and never a vision tower's convolution."""
    return any(g.kind == "experts" and is_adapted(g, target_modules) for g in shape.groups)


def _lora_dropout(spec: FineTuneJobSpec, shape: ArchitectureShape, model: str) -> float:
    if spec.method.traits.base_trains:
        return 0.0
    lora = spec.method.lora_or_default
    fused = adapts_fused_experts(shape, lora.target_modules)
    where = f"{model}'s {shape.num_experts} experts' fused weights"
    try:
        return resolve_lora_dropout(lora.dropout, where if fused else None)
    except UnsupportedSetting as exc:
        raise UnsupportedSettingError(str(exc)) from None


def workload_from_spec(spec: FineTuneJobSpec, local_files: bool = True, source: ModelSource | None = None) -> Workload:
    """Resolve the model, count its parameters under the job's method and collect the rest
    (`local_files=False`: never read an absolute model path, see `resolve_model`; `source`: the
    model's own config.json, read by the caller)."""
    source = resolve_model(spec.model, local_files, source)
    why = not_causal(source.config)
    if why is not None:
        raise InvalidModelError(f"{source.origin}: {why}")
    try:
        shape = architecture_shape(source.config)
    except PlanningError:
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:  # a config.json of odd values
        raise InvalidModelError(f"{source.origin}: cannot read the model's architecture: {exc}") from None
    method = spec.method.adaptation
    lora = spec.method.lora_or_default
    counts = count_parameters(shape, None if method_traits(method).base_trains else lora.r, lora.target_modules)
    precision = str(spec.training.precision)
    on_cpu = spec.resources.gpus_per_node == 0
    # a CPU rank computes in the job's precision too; where its CPU has no fp16 it computes in bf16,
    # of the same size (finetune_trainer.model.modeling.compute_settings)
    fp32 = precision == "fp32"
    double_quant = spec.method.qlora_or_default.double_quant
    resources = spec.resources
    return Workload(
        source=source,
        shape=shape,
        counts=counts,
        method=method,
        lora_r=lora.r,
        target_modules=tuple(lora.target_modules),
        lora_dropout=_lora_dropout(spec, shape, source.name),
        param_bytes=4 if fp32 else 2,
        mixed_precision=not fp32,
        seq_len=spec.dataset.max_seq_length,
        global_batch=spec.training.global_batch_size,
        num_nodes=resources.num_nodes,
        ranks_per_node=resources.ranks_per_node,
        quantized_bytes_per_param=NF4_DOUBLE_QUANT_BYTES if double_quant else NF4_PLAIN_BYTES,
        buffers=_buffers(spec),
        host_memory_bytes=quantity_bytes(resources.memory) if resources.memory is not None else None,
        on_cpu=on_cpu,
        packing=spec.dataset.packing,
        merged_export=spec.output.merged_model,
        objective=spec.method.objective,
        precompute_reference=bool(spec.method.preference_or_default.precompute_reference),
        start_adapter=spec.model.adapter is not None,
    )
