"""Memory planning: which ZeRO stage, offload, micro-batch and checkpointing fit.

Pure: no kopf, no Kubernetes client, no torch at import time.
"""

from ..api.spec import FineTuneJobSpec
from ..api.status import PlanStatus
from .fixed import fixed_plan


def choose_plan(spec: FineTuneJobSpec) -> PlanStatus:
    """The plan the operator and `ftjob run` use (the real planner replaces the fixed one)."""
    return fixed_plan(spec)


__all__ = ["choose_plan", "fixed_plan"]
