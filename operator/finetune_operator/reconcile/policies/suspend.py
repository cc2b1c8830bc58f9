"""`spec.suspend`: scale the workers to 0 and keep the plan; resuming starts from the last
checkpoint and announces it."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.status import PlanStatus, Workers
from ..conditions import is_true
from ..decision import Effects
from .phases import Inputs
from .status_builder import StatusBuilder


def gate(inputs: Inputs, b: StatusBuilder, plan: PlanStatus) -> Effects | None:
    """The effects of a suspended job (no workers), or None."""
    if inputs.job.spec.suspend:
        b.cond(ConditionType.SUSPENDED, True, R.SUSPENDED, "spec.suspend is true: workers scaled to 0")
        b.cond(ConditionType.RUNNING, False, R.SUSPENDED, "")
        b.update(start_time=None, workers=Workers(ready=0, total=inputs.nodes, summary=f"0/{inputs.nodes}"))
        return inputs.stop(plan)
    if is_true(b.status.conditions, ConditionType.SUSPENDED):
        b.cond(ConditionType.SUSPENDED, False, R.RESUMED, "resumed from the last checkpoint", announce=True)
    return None
