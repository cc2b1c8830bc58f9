"""Memory planning: which ZeRO stage, offload, micro-batch and checkpointing fit.

Pure: no kopf, no Kubernetes client, no torch at import time. `meta_count` and
`traced` (torch, transformers, peft) are imported only when asked for.

- `choose_plan(spec)`: the `status.plan` the operator and `ftjob run` use;
- `plan_job(spec, gpu_memory_bytes=None, traced=False)`: every candidate, explained;
- `next_frugal_plan(spec, current)`: the re-plan after an out-of-memory failure;
- `comm.bytes_per_step(...)`: the communication model, by collective;
- `fixed_plan(spec)`: the spec taken literally, without a memory model.
"""

from . import comm
from .errors import (
    DoesNotFitError,
    InvalidModelError,
    ModelConfigNotFoundError,
    PlanningError,
    UnknownArchitectureError,
)
from .fixed import fixed_plan
from .planner import PlanResult, choose_plan, plan_job
from .replan import next_frugal_plan

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
