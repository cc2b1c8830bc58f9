"""After an out-of-memory failure: the next more memory-frugal strategy, in the design's order.

The ladder (DESIGN.md) is ZeRO-2 → ZeRO-3 → + optimizer offload → + parameter offload →
smaller micro-batch with more accumulation. Turning gradient checkpointing on comes
first when it was off and not pinned: it is the cheapest way to cut activations. Each
step must be predicted to fit and to use strictly fewer bytes per GPU than the plan that
ran out of memory; what the user pinned in the spec is never changed.
"""

from __future__ import annotations

from collections.abc import Iterator

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import PlanStatus
from finetune_operator.api.strategy import Strategy
from finetune_operator.plan.search.candidates import Candidate, Pins, evaluate_all
from finetune_operator.plan.search.planner import explain, rejected_alternatives, status_of
from finetune_operator.plan.sources.model_source import ModelSource
from finetune_operator.plan.workload import DEFAULT_FIT_MARGIN, workload_from_spec

LADDER = (
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
    (3, "nvme", "none"),
    (3, "nvme", "nvme"),
)
"""Sharding and offload from least to most frugal (the re-planning ladder)."""


def _ladder_position(strategy: Strategy) -> int:
    key = (strategy.zero_stage, strategy.offload_optimizer, strategy.offload_params)
    if key in LADDER:
        return LADDER.index(key)
    if strategy.offload_optimizer == "cpu":
        return LADDER.index((3, "cpu", "none")) - 1
    return LADDER.index((3, "nvme", "none")) - 1


def _steps(current: Strategy) -> Iterator[tuple[tuple[int, str, str], int | None, bool]]:
    """(sharding/offload, micro-batch or None for any smaller one, checkpointing) in ladder order."""
    here = (current.zero_stage, current.offload_optimizer, current.offload_params)
    if not current.gradient_checkpointing:
        yield here, current.micro_batch_size, True
    for rung in LADDER[_ladder_position(current) + 1 :]:
        yield rung, current.micro_batch_size, current.gradient_checkpointing
        yield rung, current.micro_batch_size, True
    yield here, None, current.gradient_checkpointing
    yield here, None, True


def next_frugal_plan(
    spec: FineTuneJobSpec,
    current: PlanStatus,
    reason: str = "out of memory",
    margin: float = DEFAULT_FIT_MARGIN,
    source: ModelSource | None = None,
) -> PlanStatus | None:
    """The next more frugal fitting plan after `current` ran out of memory, or None (`source`: the
    model's own config.json the job was planned with)."""
    workload = workload_from_spec(spec, source=source)
    budget = int(current.gpu_memory_bytes * margin) or int(spec.resources.gpu_memory_bytes * margin)
    candidates = evaluate_all(workload, Pins.from_spec(spec), budget)
    now = Strategy.from_plan(current)
    ceiling = current.per_gpu_bytes or next(
        (c.per_gpu_bytes for c in candidates if c.strategy == now), min(c.per_gpu_bytes for c in candidates) + 1
    )
    for rung, micro, ckpt in _steps(now):
        matching = [
            c
            for c in candidates
            if c.fits
            and c.per_gpu_bytes < ceiling
            and (c.strategy.zero_stage, c.strategy.offload_optimizer, c.strategy.offload_params) == rung
            and c.strategy.gradient_checkpointing == ckpt
            and (
                c.strategy.micro_batch_size == micro
                if micro is not None
                else c.strategy.micro_batch_size < now.micro_batch_size
            )
        ]
        if matching:
            chosen: Candidate = max(matching, key=lambda c: (c.strategy.micro_batch_size, -c.step.seconds))
            explained = explain(candidates, chosen, budget, workload.host_memory_bytes, workload.device)
            chosen = explained[chosen.index]
            status = status_of(
                chosen,
                current.gpu_memory_bytes or spec.resources.gpu_memory_bytes,
                f"re-planned after {reason}: {chosen.strategy}",
                rejected_alternatives(explained, chosen),
                workload.counts.trainable,
            )
            replanned = {"replans": current.replans + 1, "replan_reason": reason[:2048]}
            return status.model_copy(update={**replanned, "model_bytes": current.model_bytes})
    return None
