"""Memory planning: which ZeRO stage, offload, micro-batch and checkpointing fit.

Pure: no kopf, no Kubernetes client, no torch at import time. `counting.meta_count` and
`search.traced` (torch, transformers, peft) are imported only when asked for.

Four rooms, layered (import-linter): `search` (the strategy search) → `admission` (what a job
may ask) → `workload` (everything memory depends on, gathered once from the spec) → `sources`
(where the model comes from) | `counting` (the model counted from its config) → `errors`.

- `choose_plan(spec)`: the `status.plan` the operator and `ftjob run` use;
- `plan_job(spec, gpu_memory_bytes=None, traced=False)`: every candidate, explained;
- `next_frugal_plan(spec, current)`: the re-plan after an out-of-memory failure;
- `comm.bytes_per_step(...)`: the communication model, by collective;
- `fixed_plan(spec)`: the spec taken literally, without a memory model.
"""

from finetune_operator.plan.errors import (
    DoesNotFitError,
    InvalidModelError,
    ModelConfigNotFoundError,
    PlanningError,
    UnknownArchitectureError,
)
from finetune_operator.plan.search import comm
from finetune_operator.plan.search.fixed import fixed_plan
from finetune_operator.plan.search.planner import PlanResult, choose_plan, plan_job
from finetune_operator.plan.search.replan import next_frugal_plan

__all__ = [
    "DoesNotFitError",
    "InvalidModelError",
    "ModelConfigNotFoundError",
    "PlanResult",
    "PlanningError",
    "UnknownArchitectureError",
    "choose_plan",
    "comm",
    "fixed_plan",
    "next_frugal_plan",
    "plan_job",
]
