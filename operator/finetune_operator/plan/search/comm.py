"""Communication and host traffic per optimizer step, and a step-time estimate to rank by.

`bytes_per_step` is public: it is the model the observability work compares with the
bytes it measures. It counts what one rank sends over the collective's ring (reduce-
scatter and all-gather move `(G-1)/G` of the buffer, all-reduce twice that) and what
crosses its PCIe link, per optimizer step of `accumulation_steps` micro-batches:

- ZeRO-0: one all-reduce of the 16-bit gradients at the accumulation boundary;
- ZeRO-1: a reduce-scatter of the gradients at the boundary, an all-gather of the updated
  16-bit parameters after the step;
- ZeRO-2: a reduce-scatter in every micro-step's backward, the same all-gather after the step;
- ZeRO-3: all-gathers of every partitioned parameter in forward and in backward (once more
  when checkpointing recomputes), a reduce-scatter per micro-step, and after the step one
  all-gather of the persistent parameters (those under `stage3_param_persistence_threshold`
  stay whole on every rank, but the optimizer updates them by partition, so DeepSpeed's
  `_post_step` gathers them again; measured exact on 2 CPU ranks, benchmarks/comm_bytes.py);
- optimizer offload: gradients down to the host each micro-step (stage 2-3) or step,
  updated parameters back up; NVMe offload reads and writes the optimizer states;
- parameter offload: each rank's parameter shard comes up for every gather.

The step time adds compute (6·N FLOPs per token for full fine-tuning, 4·N for LoRA,
+2·N when recomputing), the part of the communication that does not overlap compute,
PCIe and NVMe transfers and the CPU optimizer. Nominal bandwidths are enough to rank
candidates; they are not a performance prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "device_to_host", "host_to_device", "nvme")


@dataclass(frozen=True)
class Hardware:
    """Nominal rates used for ranking (bytes/s, FLOP/s, parameters/s)."""

    gpu_flops: float = 400e12
    intra_node_bytes_per_s: float = 150e9
    inter_node_bytes_per_s: float = 25e9
    pcie_bytes_per_s: float = 20e9
    nvme_bytes_per_s: float = 3e9
    cpu_adam_params_per_s: float = 1e9
    comm_overlap: float = 0.5
    tokens_for_half_efficiency: int = 512


DEFAULT_HARDWARE = Hardware()


def bytes_per_step(
    zero_stage: int,
    world_size: int,
    trainable_params: int,
    param_bytes_total: float,
    *,
    grad_bytes: int = 2,
    accumulation_steps: int = 1,
    gradient_checkpointing: bool = False,
    offload_optimizer: str = "none",
    offload_params: str = "none",
    persistent_param_bytes: float = 0.0,
) -> dict[str, int]:
    """Bytes one rank sends per optimizer step, by collective (and host/NVMe traffic).

    `param_bytes_total` is the size of the parameters ZeRO-3 gathers in every pass (those
    above the persistence threshold); `persistent_param_bytes` the size of those below it,
    gathered once after each optimizer step; `trainable_params` the number whose gradients
    are reduced.
    """
    world, steps = world_size, accumulation_steps
    ring = (world - 1) / world if world > 1 else 0.0
    grads = grad_bytes * trainable_params
    out = dict.fromkeys(COLLECTIVES, 0.0)
    if zero_stage == 0:
        out["all_reduce"] = 2 * ring * grads
    elif zero_stage in (1, 2):
        # DeepSpeed (0.19, use_multi_rank_bucket_allreduce on by default) all-reduces the
        # gradient buckets and keeps its partition, then all-gathers the updated weights;
        # stage 2 reduces at every micro-step, stage 1 at the boundary
        reduces = steps if zero_stage == 2 else 1
        out["all_reduce"] = reduces * 2 * ring * grads
        out["all_gather"] = ring * grads
    else:
        gathers_per_micro_step = 3 if gradient_checkpointing else 2
        out["all_gather"] = steps * gathers_per_micro_step * ring * param_bytes_total
        out["reduce_scatter"] = steps * ring * grads
        out["all_gather"] += ring * persistent_param_bytes
    shard = world if zero_stage >= 1 else 1
    if offload_optimizer != "none":
        downs = steps if zero_stage >= 2 else 1
        out["device_to_host"] = downs * grads / shard
        out["host_to_device"] = grad_bytes * trainable_params / shard
        if offload_optimizer == "nvme":
            out["nvme"] = 2 * 16 * trainable_params / shard
    if offload_params != "none":
        gathers = 3 if gradient_checkpointing else 2
        out["host_to_device"] += steps * gathers * param_bytes_total / world
    return {key: int(value) for key, value in out.items()}


@dataclass(frozen=True)
class StepTime:
    seconds: float
    compute_seconds: float
    exposed_comm_seconds: float
    offload_seconds: float


def step_time(
    traffic: dict[str, int],
    *,
    flops_per_rank: float,
    tokens_per_micro_step: int,
    trainable_per_rank: float,
    optimizer_on_cpu: bool,
    multi_node: bool,
    hardware: Hardware = DEFAULT_HARDWARE,
) -> StepTime:
    """Seconds per optimizer step: compute, exposed communication, offload traffic."""
    efficiency = tokens_per_micro_step / (tokens_per_micro_step + hardware.tokens_for_half_efficiency)
    compute = flops_per_rank / (hardware.gpu_flops * efficiency)
    link = hardware.inter_node_bytes_per_s if multi_node else hardware.intra_node_bytes_per_s
    comm = (traffic["all_reduce"] + traffic["reduce_scatter"] + traffic["all_gather"]) / link
    exposed = max(comm - hardware.comm_overlap * compute, comm * (1 - hardware.comm_overlap))
    offload = (traffic["device_to_host"] + traffic["host_to_device"]) / hardware.pcie_bytes_per_s
    offload += traffic["nvme"] / hardware.nvme_bytes_per_s
    if optimizer_on_cpu:
        offload += trainable_per_rank / hardware.cpu_adam_params_per_s
    return StepTime(compute + exposed + offload, compute, exposed, offload)
