"""The strategies a job could run with, each evaluated for memory, fit and speed.

Enumeration respects what the user pinned in the spec (`deepspeed.zeroStage`, the
offloads, `training.microBatchSize`, `training.gradientCheckpointing`); everything left
`auto` is explored. NVMe offload is only considered when the spec names an NVMe path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan.search.comm import StepTime, bytes_per_step, step_time
from finetune_operator.plan.search.memory import (
    MemoryEstimate,
    estimate_memory,
    frozen_weight_bytes,
    persisted_param_bytes,
)
from finetune_operator.plan.workload import Workload

GIB = 2**30

FRUGALITY_TIERS = (
    ("none", "none", False),
    ("none", "none", True),
    ("cpu", "none", None),
    ("cpu", "cpu", None),
    ("nvme", "none", None),
    ("nvme", "nvme", None),
)
"""(optimizer offload, parameter offload, ZeRO-3?) from least to most sharding/offload;
None means any stage. This is the order of the design's OOM re-planning ladder."""


def frugality_tier(strategy: Strategy) -> int:
    for tier, (optimizer, params, zero3) in enumerate(FRUGALITY_TIERS):
        if (strategy.offload_optimizer, strategy.offload_params) == (optimizer, params) and (
            zero3 is None or zero3 == (strategy.zero_stage == 3)
        ):
            return tier
    return len(FRUGALITY_TIERS)


@dataclass(frozen=True)
class Pins:
    """What the spec fixes; None means the planner chooses."""

    zero_stage: int | None = None
    offload_optimizer: str | None = None
    offload_params: str | None = None
    gradient_checkpointing: bool | None = None
    micro_batch_size: int | None = None
    nvme_allowed: bool = False

    @classmethod
    def from_spec(cls, spec: FineTuneJobSpec) -> Pins:
        ds, training = spec.deepspeed, spec.training
        checkpointing = training.gradient_checkpointing
        return cls(
            zero_stage=None if ds.zero_stage == "auto" else int(ds.zero_stage),
            offload_optimizer=None if ds.offload_optimizer == "auto" else str(ds.offload_optimizer),
            offload_params=None if ds.offload_params == "auto" else str(ds.offload_params),
            gradient_checkpointing=None if checkpointing == "auto" else checkpointing == "true",
            micro_batch_size=None if training.micro_batch_size == "auto" else int(training.micro_batch_size),
            nvme_allowed=ds.nvme_path is not None or "nvme" in (ds.offload_optimizer, ds.offload_params),
        )

    @property
    def any(self) -> bool:
        return any(
            value is not None
            for value in (
                self.zero_stage,
                self.offload_optimizer,
                self.offload_params,
                self.gradient_checkpointing,
                self.micro_batch_size,
            )
        )


def _offload_pairs(stage: int, nvme: bool) -> list[tuple[str, str]]:
    devices = ["none", "cpu"] + (["nvme"] if nvme else [])
    if stage == 0:
        return [("none", "none")]
    pairs = [(device, "none") for device in devices]
    if stage == 3:
        pairs += [(device, device) for device in devices if device != "none"]
    return pairs


def micro_batch_options(workload: Workload, pinned: int | None) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs keeping the global batch, largest micro-batch first."""
    per_rank = workload.per_rank_batch
    if pinned is not None:
        return [(pinned, max(1, per_rank // pinned))]
    return [(m, per_rank // m) for m in range(per_rank, 0, -1) if per_rank % m == 0]


def enumerate_strategies(workload: Workload, pins: Pins) -> Iterator[Strategy]:
    stages = [pins.zero_stage] if pins.zero_stage is not None else [0, 1, 2, 3]
    checkpointing = [pins.gradient_checkpointing] if pins.gradient_checkpointing is not None else [False, True]
    for stage in stages:
        for optimizer, params in _offload_pairs(stage, pins.nvme_allowed):
            if pins.offload_optimizer not in (None, optimizer) or pins.offload_params not in (None, params):
                continue
            for micro, accumulation in micro_batch_options(workload, pins.micro_batch_size):
                for ckpt in checkpointing:
                    yield Strategy(
                        zero_stage=stage,
                        offload_optimizer=optimizer,
                        offload_params=params,
                        gradient_checkpointing=ckpt,
                        micro_batch_size=micro,
                        gradient_accumulation_steps=accumulation,
                    )


@dataclass(frozen=True)
class Candidate:
    """One strategy with its memory estimate, traffic, step time and verdict."""

    index: int
    strategy: Strategy
    memory: MemoryEstimate
    traffic: dict[str, int]
    step: StepTime
    fits_gpu: bool
    fits_host: bool
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    @property
    def per_gpu_bytes(self) -> int:
        return self.memory.per_gpu_bytes

    @property
    def tier(self) -> int:
        return frugality_tier(self.strategy)


def _flops_per_rank(workload: Workload, strategy: Strategy) -> float:
    shape = workload.shape
    tokens = strategy.micro_batch_size * strategy.gradient_accumulation_steps * workload.seq_len
    passes = 6 if workload.traits.base_trains else 4
    passes += 2 if strategy.gradient_checkpointing else 0
    attention = 2 * shape.num_layers * workload.seq_len * shape.q_dim
    return float(tokens * (passes * shape.active_params + passes * attention))


def evaluate(
    workload: Workload,
    strategy: Strategy,
    index: int,
    gpu_budget: float,
    activation_override: int | None = None,
) -> Candidate:
    """Memory, traffic and step time of one strategy, and whether it fits."""
    memory = estimate_memory(workload, strategy, activation_override)
    stored = frozen_weight_bytes(workload) + workload.counts.trainable * workload.param_bytes
    persistent = persisted_param_bytes(workload)
    gathered = max(0.0, stored - persistent)
    traffic = bytes_per_step(
        strategy.zero_stage,
        workload.world_size,
        workload.counts.trainable,
        gathered,
        grad_bytes=workload.param_bytes,
        accumulation_steps=strategy.gradient_accumulation_steps,
        gradient_checkpointing=strategy.gradient_checkpointing,
        offload_optimizer=strategy.offload_optimizer,
        offload_params=strategy.offload_params,
        persistent_param_bytes=persistent,
    )
    shard = workload.world_size if strategy.zero_stage >= 1 else 1
    timing = step_time(
        traffic,
        flops_per_rank=_flops_per_rank(workload, strategy),
        tokens_per_micro_step=strategy.micro_batch_size * workload.seq_len,
        trainable_per_rank=workload.counts.trainable / shard,
        optimizer_on_cpu=strategy.offload_optimizer != "none",
        multi_node=workload.num_nodes > 1,
    )
    host_limit = workload.host_memory_bytes
    return Candidate(
        index=index,
        strategy=strategy,
        memory=memory,
        traffic=traffic,
        step=timing,
        fits_gpu=memory.per_gpu_bytes <= gpu_budget,
        fits_host=host_limit is None or memory.host_peak_bytes_per_node <= host_limit,
    )


def evaluate_all(
    workload: Workload, pins: Pins, gpu_budget: float, activation_override: dict[bool, int] | None = None
) -> list[Candidate]:
    """Every allowed strategy, evaluated; `activation_override[ckpt]` is a traced peak per sequence."""
    out = []
    for index, strategy in enumerate(enumerate_strategies(workload, pins)):
        override = None
        if activation_override is not None:
            override = activation_override[strategy.gradient_checkpointing] * strategy.micro_batch_size
        out.append(evaluate(workload, strategy, index, gpu_budget, override))
    return out


def pick(candidates: list[Candidate]) -> Candidate | None:
    """The rule: the least sharding/offload tier that has a fitting candidate, and in it the fastest."""
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda c: (c.tier, c.step.seconds, c.per_gpu_bytes, c.index))
