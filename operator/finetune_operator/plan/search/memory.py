"""Analytical bytes per GPU (and per host) of one strategy, term by term.

Terms use DeepSpeed's own accounting so that, for full fine-tuning, the model states
agree with `estimate_zero2/3_model_states_mem_needs`: with T trainable and F frozen
parameters, e bytes per 16-bit value and G ranks,

- weights: the frozen base, `F·e` (QLoRA: NF4 for the quantisable linears), `/G` at ZeRO-3;
- trainableWeights: the 16-bit copy of what trains, `T·e`, `/G` at ZeRO-3;
- gradients: the 16-bit gradients and the fp32 copy the optimizer steps on. Stage 0-1 keep
  the 16-bit gradients whole; stage 2 keeps 16-bit and fp32 partitions, `(e+4)·T/G`; stage 3
  holds a 16-bit partition during backward and an fp32 one during the step, counted as
  `4·T/G` (the backward and step peaks never coincide, and activations dwarf the
  difference). Optimizer offload moves them to the host.
- optimizerStates: fp32 master weights and Adam's two moments, `12·T`, `/G` from stage 1,
  on the host with optimizer offload (fp32 training has no separate master copy);
- buffers: the two reduce buckets of stage 1-2 (sized to the trainable count when rendered), or
  at stage 3 the largest layer
  gathered whole with its gradient, the prefetch and reduce buckets and the small
  parameters that stay unpartitioned;
- activations and logits: `activations.py`; overhead: CUDA context and workspaces.

Parameter offload (stage 3) moves the weight terms to the host.

On the host, each node holds its ranks' baseline and what offload moved there; at the very end
node 0 also holds the final export in rank 0's RAM (`export_host_bytes`: the whole model gathered
for a full fine-tune, the unquantised base for a merged export) while its other ranks still hold
theirs. The pod requests the larger of the two (`host_peak_bytes_per_node`), since the export
was once OOM-killed after the whole run had trained.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_operator.api.methods import ReferenceModel
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan.search.activations import activation_bytes
from finetune_operator.plan.workload import HOST_BASELINE_PER_RANK, Workload, per_workload

BREAKDOWN_KEYS = (
    "weights",
    "trainable_weights",
    "gradients",
    "optimizer_states",
    "activations",
    "logits",
    "buffers",
    "overhead",
)
"""The snake_case names of `api.status.MemoryBreakdown`'s fields, in display order."""
MODEL_STATE_KEYS = BREAKDOWN_KEYS[:4]
ADAM_BYTES = 8
FP32_BYTES = 4


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by term, the host bytes each node needs, and NVMe use."""

    breakdown: dict[str, int]
    host_bytes_per_node: int
    nvme_bytes_per_node: int
    host_model_state_bytes_per_rank: int
    load_peak_bytes: int = 0
    """Per GPU while the model loads, where loading is not partitioned (`load_peak_bytes`), else 0."""
    export_host_bytes: int = 0
    """Rank 0's host memory for the final export, on node 0, on top of `host_bytes_per_node`."""

    @property
    def host_peak_bytes_per_node(self) -> int:
        """The host memory a pod needs at its highest: node 0 during the final export."""
        return self.host_bytes_per_node + self.export_host_bytes

    @property
    def step_bytes(self) -> int:
        """The training step's peak: the sum of the breakdown."""
        return sum(self.breakdown.values())

    @property
    def per_gpu_bytes(self) -> int:
        """What the GPU must hold at its highest: the step, or loading the model where that is more."""
        return max(self.step_bytes, self.load_peak_bytes)

    @property
    def model_state_bytes(self) -> int:
        return sum(self.breakdown[key] for key in MODEL_STATE_KEYS)


@per_workload
def frozen_weight_bytes(workload: Workload) -> int:
    """The frozen base in its storage format (NF4 for QLoRA's quantisable linears)."""
    counts = workload.counts
    if workload.traits.base_trains:
        return 0
    if workload.traits.base_quantized:
        quantized = int(counts.quantizable * workload.quantized_bytes_per_param)
        return quantized + (counts.frozen - counts.quantizable) * workload.param_bytes
    return counts.frozen * workload.param_bytes


REFERENCE_ADAPTER_BYTES = 4
"""A frozen copy of a loaded adapter, counted in fp32 (peft keeps adapter weights in fp32 beside a 16-bit base)."""


def reference_weight_bytes(workload: Workload) -> int:
    """The reference's own weights, sharded and offloaded like the policy's parameters: full
    fine-tuning DPO's frozen copy of the whole model (16-bit), or a preference job that started
    from an adapter (`model.adapter`): that adapter, frozen. None when the reference is
    precomputed, or is the adapter methods' own base with the adapter off."""
    if workload.reference is ReferenceModel.START_ADAPTER:
        return workload.counts.trainable * REFERENCE_ADAPTER_BYTES
    if workload.reference is not ReferenceModel.FROZEN_COPY:
        return 0
    return (workload.counts.trainable + workload.counts.frozen) * workload.param_bytes


@per_workload
def persistent_adapter_params(workload: Workload) -> int:
    """LoRA matrices below ZeRO-3's persistence threshold: kept whole on every rank, not sharded."""
    threshold, out = workload.buffers.persistence_threshold, 0
    for adapted in workload.adapted:  # none in full fine-tuning
        group = adapted.group
        for side in (group.in_features, group.out_features):
            matrix = group.experts * adapted.rank * side
            out += group.copies * matrix if matrix < threshold else 0
    return out


@per_workload
def persisted_param_bytes(workload: Workload) -> float:
    """Bytes of parameters ZeRO-3 keeps whole on every rank (below the persistence threshold).

    They are not gathered in forward or backward; DeepSpeed gathers them once after each
    optimizer step, which updated them by partition (see `comm.bytes_per_step`).
    """
    return workload.param_bytes * (small_params(workload) + persistent_adapter_params(workload))


@per_workload
def small_params(workload: Workload) -> int:
    """Parameters in tensors below ZeRO-3's persistence threshold (norms, biases): never partitioned."""
    threshold = workload.buffers.persistence_threshold
    return sum(g.params for g in workload.shape.groups if g.params_each < threshold)


def _gradient_bytes(workload: Workload, stage: int, offloaded: bool) -> float:
    trainable, world, e = workload.counts.trainable, workload.world_size, workload.param_bytes
    fp32_copy = FP32_BYTES if workload.mixed_precision else 0
    if stage == 0:
        return trainable * (e + fp32_copy)
    if stage == 1:
        return trainable * e + (0 if offloaded else trainable * fp32_copy / world)
    if offloaded:
        return 0.0
    if stage == 2:
        return trainable * (e + fp32_copy) / world
    return trainable * max(e, fp32_copy) / world


def _buffer_bytes(workload: Workload, stage: int) -> float:
    e, buffers, trainable = workload.param_bytes, workload.buffers, workload.counts.trainable
    if stage in (1, 2):  # two reduce buffers (overlap_comm), allocated whole: the renderer sizes them to T
        return 2 * e * min(buffers.reduce_bucket, trainable)
    if stage == 3:
        unpartitioned = small_params(workload)
        gathered_layer = 2 * e * workload.counts.largest_layer
        return (
            gathered_layer + e * (buffers.prefetch_bucket + min(buffers.reduce_bucket, trainable)) + e * unpartitioned
        )
    return 0.0


def load_peak_bytes(workload: Workload, strategy: Strategy) -> int:
    """Per GPU while the model loads, before `deepspeed.initialize` partitions it.

    QLoRA under ZeRO-3 cannot load partitioned (bitsandbytes quantises whole tensors), so every
    GPU holds the whole 4-bit model and the 16-bit weights it does not quantise (embeddings, the
    head, norms; the trainer keeps them 16-bit, `modeling.freeze_4bit_base`). Every other plan
    loads partitioned (ZeRO-3) or keeps the whole model for the step anyway: 0."""
    if not workload.traits.base_quantized or strategy.zero_stage != 3:
        return 0
    return int(frozen_weight_bytes(workload) + workload.overhead_bytes)


def export_host_bytes(workload: Workload) -> int:
    """Rank 0's host memory for the final export (`finetune_trainer.model.export`).

    A full fine-tune gathers every parameter, in its 16-bit (or fp32) training dtype, into rank
    0's RAM before writing them; a merged export (`output.mergedModel`, LoRA or QLoRA) loads the
    base model unquantised in the compute dtype on rank 0 and merges the adapter into it; an
    adapter alone is its trainable parameters. Strategy-independent: the export runs once, after
    the last step, whatever the sharding."""
    counts, e = workload.counts, workload.param_bytes
    if workload.traits.base_trains:
        return counts.total * e
    adapter = counts.trainable * e
    return counts.total * e + adapter if workload.merged_export else adapter


def estimate_memory(workload: Workload, strategy: Strategy, activation_override: int | None = None) -> MemoryEstimate:
    """Per-GPU bytes of `strategy` for `workload`, by term; `activation_override` replaces the
    analytical activations+logits peak (traced planning)."""
    stage, world = strategy.zero_stage, workload.world_size
    counts, e = workload.counts, workload.param_bytes
    opt_offloaded = strategy.offload_optimizer != "none"
    params_offloaded = strategy.offload_params != "none"
    param_shard = world if stage == 3 else 1
    optimizer_shard = world if stage >= 1 else 1

    frozen = (frozen_weight_bytes(workload) + reference_weight_bytes(workload)) / param_shard
    persistent = persistent_adapter_params(workload) if stage == 3 else 0
    trainable16 = (counts.trainable - persistent) * e / param_shard + persistent * e
    master = FP32_BYTES * counts.trainable if workload.mixed_precision else 0
    optimizer = (master + ADAM_BYTES * counts.trainable) / optimizer_shard
    gradients = _gradient_bytes(workload, stage, opt_offloaded)

    act = activation_bytes(workload, strategy.micro_batch_size, strategy.gradient_checkpointing)
    activations, logits = act.activations, act.logits
    if activation_override is not None:
        activations = max(0, activation_override - logits)

    host_states = 0.0
    if opt_offloaded:
        host_states += optimizer + counts.trainable * (FP32_BYTES + (e if stage == 3 else 0)) / optimizer_shard
        optimizer = 0.0
    if params_offloaded:
        host_states += frozen + trainable16
        frozen = trainable16 = 0.0
    nvme_per_rank = 0.0
    host_per_rank = HOST_BASELINE_PER_RANK + host_states
    if strategy.offload_optimizer == "nvme":
        nvme_per_rank = host_states
        staging = 2 * FP32_BYTES * min(workload.buffers.sub_group_size, counts.trainable / optimizer_shard)
        host_per_rank = HOST_BASELINE_PER_RANK + min(host_states, staging)

    breakdown = {
        "weights": int(frozen),
        "trainable_weights": int(trainable16),
        "gradients": int(gradients),
        "optimizer_states": int(optimizer),
        "activations": int(activations),
        "logits": int(logits),
        "buffers": int(_buffer_bytes(workload, stage)),
        "overhead": int(workload.overhead_bytes),
    }
    return MemoryEstimate(
        breakdown=breakdown,
        host_bytes_per_node=int(host_per_rank * workload.ranks_per_node),
        nvme_bytes_per_node=int(nvme_per_rank * workload.ranks_per_node),
        host_model_state_bytes_per_rank=int(host_states),
        load_peak_bytes=load_peak_bytes(workload, strategy),
        export_host_bytes=export_host_bytes(workload),
    )


def resident_model_state_bytes(workload: Workload, strategy: Strategy) -> int:
    """What an engine keeps between steps, per rank, on the GPU and the host together.

    16-bit parameters (at ZeRO-3 a shard, small LoRA matrices whole), the gradient buffers
    DeepSpeed keeps allocated (the 16-bit shard at stage 3, an fp32 shard next to an
    offloaded optimizer), fp32 master weights and Adam moments. Gradients that
    live only between backward and step are not included. `benchmarks/planner_real_engines.py`
    compares this with the tensors real engines hold.
    """
    counts, e, world, stage = workload.counts, workload.param_bytes, workload.world_size, strategy.zero_stage
    param_shard = world if stage == 3 else 1
    persistent = persistent_adapter_params(workload) if stage == 3 else 0
    frozen = frozen_weight_bytes(workload) + reference_weight_bytes(workload)
    params = (frozen + (counts.trainable - persistent) * e) / param_shard + persistent * e
    fp32_grads = FP32_BYTES * counts.trainable if workload.mixed_precision else 0
    offloaded = strategy.offload_optimizer != "none"
    if stage < 3:
        grads = fp32_grads / world if offloaded else 0.0
    else:
        grads = (counts.trainable * e + (FP32_BYTES * counts.trainable if offloaded else 0)) / world
    master = FP32_BYTES * counts.trainable if workload.mixed_precision else 0
    states = (master + ADAM_BYTES * counts.trainable) / (world if stage >= 1 else 1)
    return int(params + grads + states)
