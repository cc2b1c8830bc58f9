"""What would fit when nothing does: more GPUs, a cheaper method, a shorter sequence.

Each suggestion is checked by planning the changed job, so the advice never names a
change that would not actually fit.
"""

from __future__ import annotations

from finetune_operator.api.methods import Objective
from finetune_operator.plan.search.candidates import Candidate, Pins, evaluate_all, pick
from finetune_operator.plan.search.memory import frozen_weight_bytes
from finetune_operator.plan.workload import GIB, Workload

MAX_GPU_MULTIPLIER = 64
MIN_SEQUENCE = 256


def _fits(workload: Workload, pins: Pins, budget: float) -> str | None:
    chosen = pick(evaluate_all(workload, pins, budget))
    return None if chosen is None else f"{chosen.strategy}, {chosen.per_gpu_bytes / GIB:.1f} GiB per GPU"


def what_would_fit(
    workload: Workload, pins: Pins, gpu_memory: int, margin: float, candidates: list[Candidate]
) -> list[str]:
    budget = gpu_memory * margin
    out: list[str] = []
    # where the adaptation is set: method.type for SFT, method.preference.base for dpo and orpo
    field = "method.type" if workload.objective == Objective.SFT else "method.preference.base"
    weights = frozen_weight_bytes(workload) + workload.counts.trainable * workload.param_bytes
    if weights > budget and workload.traits.base_quantized:
        out.append(
            f"the 4-bit weights are {weights / GIB:.1f} GiB, more than the {budget / GIB:.1f} GiB usable on one GPU, "
            "and a QLoRA model loads whole on every GPU before ZeRO-3 partitions it (bitsandbytes quantises whole "
            f"tensors): it needs bigger GPUs, or LoRA ({field}: lora), which loads partitioned"
        )
    elif weights > budget:
        out.append(
            f"the weights alone are {weights / GIB:.1f} GiB, more than the {budget / GIB:.1f} GiB usable on one GPU: "
            "they must be sharded (ZeRO-3 over more GPUs), quantised (qlora) or offloaded"
        )
    if pins.any:
        unpinned = _fits(workload, Pins(nvme_allowed=pins.nvme_allowed), budget)
        if unpinned:
            out.append(f"leave deepspeed.* and training.microBatchSize/gradientCheckpointing on auto: {unpinned}")
    for factor in (2, 4, 8, 16, 32, MAX_GPU_MULTIPLIER):
        bigger = workload.with_world(workload.num_nodes * factor, workload.ranks_per_node)
        found = _fits(bigger, pins, budget)
        if found:
            out.append(
                f"more GPUs: {bigger.world_size} GPUs (resources.numNodes: {bigger.num_nodes}) would fit with {found}"
            )
            break
    for method in workload.traits.lighter:
        found = _fits(workload.with_method(method), pins, budget)
        if found:
            out.append(f"{field}: {method} would fit with {found}")
            break
    seq = workload.seq_len // 2
    while seq >= MIN_SEQUENCE:
        found = _fits(workload.with_seq_len(seq), pins, budget)
        if found:
            out.append(f"a shorter sequence: dataset.maxSeqLength: {seq} would fit with {found}")
            break
        seq //= 2
    best = min(candidates, key=lambda c: c.per_gpu_bytes, default=None)
    if best is not None:
        needed = best.per_gpu_bytes / margin
        out.append(f"bigger GPUs: {best.strategy} needs {needed / GIB:.0f} GiB GPUs at the {margin:.0%} margin")
    if workload.host_memory_bytes is not None and any(c.fits_gpu and not c.fits_host for c in candidates):
        export = max((c.memory.export_host_bytes for c in candidates), default=0)
        limit = workload.host_memory_bytes
        if export and any(c.fits_gpu and c.memory.host_bytes_per_node <= limit for c in candidates):
            out.append(
                f"more host memory (resources.memory): training fits, but the final export needs "
                f"{export / GIB:.1f} GiB more in rank 0's RAM on node 0"
                + ("" if workload.traits.base_trains else "; or output.mergedModel: false")
            )
        else:
            out.append("more host memory (resources.memory): some strategies fit the GPUs but not the host")
    return out
