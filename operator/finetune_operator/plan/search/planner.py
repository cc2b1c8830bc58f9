"""The planner's entry points: evaluate every allowed strategy, choose, and explain.

`plan_job` returns a `PlanResult` (chosen candidate, every candidate with its verdict,
JSON for `ftjob plan --json`); `choose_plan` is what the operator and `ftjob run` call
and returns the `PlanStatus` that goes into `status.plan`. The choice follows the design
rule: the least sharding and offload that fits with a margin (ZeRO-3 only when no
ZeRO-0/1/2 strategy fits; offload only when no GPU-only strategy fits), and the
fastest candidate of that tier by the step-time model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from finetune_operator.api.spec import FineTuneJobSpec
from finetune_operator.api.status import MemoryBreakdown, PlanStatus, RejectedCandidate
from finetune_operator.plan.admission.model_bytes import check_model_cache, model_bytes
from finetune_operator.plan.errors import DoesNotFitError
from finetune_operator.plan.search.advice import what_would_fit
from finetune_operator.plan.search.candidates import Candidate, Pins, evaluate_all, pick
from finetune_operator.plan.sources.model_source import ModelSource
from finetune_operator.plan.workload import DEFAULT_FIT_MARGIN, GIB, Workload, workload_from_spec

MAX_REJECTED_IN_STATUS = 16


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def candidate_json(candidate: Candidate, with_verdict: bool) -> dict[str, Any]:
    """A candidate in the `ftjob plan --json` form."""
    out: dict[str, Any] = {
        **candidate.strategy.to_wire(),
        "perGpuBytes": candidate.per_gpu_bytes,
        "breakdown": MemoryBreakdown(**candidate.memory.breakdown).to_wire(),
        "hostBytesPerNode": candidate.memory.host_peak_bytes_per_node,
        "estimatedStepSeconds": round(candidate.step.seconds, 4),
    }
    if with_verdict:
        out["fits"] = candidate.fits
        out["reason"] = candidate.reason
    return out


@dataclass
class PlanResult:
    """Every candidate with its verdict, and the chosen one (None when nothing fits)."""

    workload: Workload
    gpu_memory_bytes: int
    gpu_budget_bytes: int
    candidates: list[Candidate]
    chosen: Candidate | None
    verdict: str
    traced: bool = False
    suggestions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": candidate_json(self.chosen, with_verdict=False) if self.chosen else None,
            "candidates": [candidate_json(c, with_verdict=True) for c in self.candidates],
            "gpuMemoryBytes": self.gpu_memory_bytes,
        }

    def to_status(self, candidate: Candidate | None = None) -> PlanStatus:
        """The `status.plan` of the chosen (or the given) candidate."""
        chosen = candidate or self.chosen
        if chosen is None:
            raise DoesNotFitError(self.verdict, self.suggestions)
        rejected = rejected_alternatives(self.candidates, chosen)
        status = status_of(chosen, self.gpu_memory_bytes, self.verdict, rejected, self.workload.counts.trainable)
        return status.model_copy(update={"model_bytes": model_bytes(self.workload)})


def status_of(
    candidate: Candidate,
    gpu_memory_bytes: int,
    reason: str,
    rejected: list[RejectedCandidate],
    trainable_parameters: int | None = None,
) -> PlanStatus:
    return PlanStatus(
        **candidate.strategy.strategy_fields(),
        per_gpu_bytes=candidate.per_gpu_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        host_bytes_per_node=candidate.memory.host_peak_bytes_per_node,
        estimated_step_seconds=round(candidate.step.seconds, 4),
        breakdown=MemoryBreakdown(**candidate.memory.breakdown),
        reason=reason[:2048],
        rejected=rejected,
        candidate_index=candidate.index,
        trainable_parameters=trainable_parameters,
    )


def rejected_alternatives(candidates: list[Candidate], chosen: Candidate) -> list[RejectedCandidate]:
    """The best candidate of each other sharding/offload strategy, with why it lost."""
    best: dict[tuple[int, str, str], Candidate] = {}
    for c in candidates:
        key = (c.strategy.zero_stage, c.strategy.offload_optimizer, c.strategy.offload_params)
        if c is chosen:
            continue
        held = best.get(key)
        rank = (not c.fits, c.step.seconds if c.fits else c.per_gpu_bytes)
        if held is None or rank < (not held.fits, held.step.seconds if held.fits else held.per_gpu_bytes):
            best[key] = c
    ordered = sorted(best.values(), key=lambda c: (c.tier, c.strategy.zero_stage))
    return [
        RejectedCandidate(summary=str(c.strategy)[:256], reason=c.reason[:1024])
        for c in ordered[:MAX_REJECTED_IN_STATUS]
    ]


def explain(
    candidates: list[Candidate], chosen: Candidate | None, budget: float, host_limit: int | None, device: str = "GPU"
) -> list[Candidate]:
    """Attach a reason to every candidate: why it was chosen, or why not."""
    from dataclasses import replace

    out = []
    for c in candidates:
        if not c.fits_gpu:
            over = gib(c.per_gpu_bytes - budget)
            reason = f"does not fit by {over} per {device} ({gib(c.per_gpu_bytes)} > {gib(budget)})"
            if c.memory.load_peak_bytes > c.memory.step_bytes:
                reason += f", at load (the whole 4-bit model; the step needs {gib(c.memory.step_bytes)})"
        elif not c.fits_host:
            export = c.memory.export_host_bytes
            during = f" (with the final export's {gib(export)} on node 0)" if export else ""
            reason = (
                f"host memory: needs {gib(c.memory.host_peak_bytes_per_node)} per node{during}, "
                f"resources.memory is {gib(host_limit or 0)}"
            )
        elif chosen is None:
            reason = "fits"
        elif c is chosen:
            reason = "chosen: the least sharding and offload that fits, and the fastest such candidate"
        else:
            slower = (c.step.seconds / chosen.step.seconds - 1) * 100
            speed = f"slower by {slower:.0f}%" if slower >= 0 else f"{-slower:.0f}% faster"
            if c.tier > chosen.tier:
                reason = f"fits, but shards or offloads more than needed ({speed})"
            else:
                reason = f"fits, {speed}"
        out.append(replace(c, reason=reason))
    return out


def _verdict(chosen: Candidate | None, workload: Workload, gpu_memory: int, budget: float) -> str:
    plural = "s" if workload.world_size > 1 else ""
    if workload.on_cpu:  # the budget is still resources.gpuMemory: say so, in CPU words
        where = f"{workload.world_size} CPU rank{plural} (budget from resources.gpuMemory {gib(gpu_memory)})"
    else:
        where = f"{workload.world_size} GPU{plural} of {gib(gpu_memory)}"
    device = workload.device
    if chosen is None:
        return (
            f"nothing fits: {workload.source.name} ({workload.method}, seq {workload.seq_len}) on {where} "
            f"(usable {gib(budget)} each)"
        )
    s = chosen.strategy
    loading = chosen.memory.load_peak_bytes
    at_load = (
        f" (at load: the whole 4-bit model on each {device} before ZeRO-3 partitions it; the step needs "
        f"{gib(chosen.memory.step_bytes)})"
        if loading > chosen.memory.step_bytes
        else ""
    )
    return (
        f"{s} fits: {gib(chosen.per_gpu_bytes)} of {gib(budget)} usable per {device} on {where}{at_load}, "
        f"~{chosen.step.seconds:.2f} s/step"
    )


def plan_workload(
    workload: Workload,
    pins: Pins,
    gpu_memory_bytes: int,
    margin: float = DEFAULT_FIT_MARGIN,
    activation_override: dict[bool, int] | None = None,
) -> PlanResult:
    """Evaluate, choose and explain, for an already resolved workload."""
    budget = int(gpu_memory_bytes * margin)
    candidates = evaluate_all(workload, pins, budget, activation_override)
    chosen = pick(candidates)
    candidates = explain(candidates, chosen, budget, workload.host_memory_bytes, workload.device)
    chosen = candidates[chosen.index] if chosen is not None else None
    return PlanResult(
        workload=workload,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_budget_bytes=budget,
        candidates=candidates,
        chosen=chosen,
        verdict=_verdict(chosen, workload, gpu_memory_bytes, budget),
        traced=activation_override is not None,
    )


def traced_activations(spec: FineTuneJobSpec, workload: Workload) -> dict[bool, int]:
    """The traced activation+logits peak of one sequence, with and without checkpointing."""
    import torch

    from finetune_operator.plan.search.traced import trace_training_step

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(spec.training.precision), torch.float32)
    lora_r = None if workload.traits.base_trains else workload.lora_r
    return {
        ckpt: trace_training_step(
            workload.source.config,
            1,
            workload.seq_len,
            lora_r=lora_r,
            target_modules=workload.target_modules,
            lora_dropout=workload.lora_dropout,
            gradient_checkpointing=ckpt,
            dtype=dtype,
            cuda_dropout=not workload.on_cpu,
        ).activation_peak_bytes
        for ckpt in (False, True)
    }


def plan_job(
    spec: FineTuneJobSpec,
    gpu_memory_bytes: int | None = None,
    traced: bool = False,
    margin: float = DEFAULT_FIT_MARGIN,
    require_fit: bool = True,
    *,
    local_files: bool = True,
    source: ModelSource | None = None,
) -> PlanResult:
    """Plan a job. Raises `DoesNotFitError` (with what would fit) when nothing fits and
    `require_fit` is true, `InvalidModelError` for an unknown or unreadable model, and
    `UnsupportedSettingError` for a model cache too small for the model's files.
    `source`: the model's own config.json, when the caller read it (the operator)."""
    workload = workload_from_spec(spec, local_files, source)
    check_model_cache(spec, model_bytes(workload))
    memory = gpu_memory_bytes if gpu_memory_bytes is not None else spec.resources.gpu_memory_bytes
    override = traced_activations(spec, workload) if traced else None
    pins = Pins.from_spec(spec)
    result = plan_workload(workload, pins, memory, margin, override)
    if result.chosen is None:
        result.suggestions = what_would_fit(workload, pins, memory, margin, result.candidates)
        if require_fit:
            raise DoesNotFitError(result.verdict, result.suggestions)
    return result


def choose_plan(spec: FineTuneJobSpec, local_files: bool = True, source: ModelSource | None = None) -> PlanStatus:
    """The plan the operator (`local_files=False`) and `ftjob run` use: the chosen candidate as `status.plan`."""
    return plan_job(spec, local_files=local_files, source=source).to_status()
