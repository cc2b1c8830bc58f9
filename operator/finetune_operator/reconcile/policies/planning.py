"""The plan in force: planned once per generation of the spec. A re-plan after an out-of-memory
error survives a spec edit's new plan in its counters; a spec the planner refuses fails the
job (InvalidSpec, DoesNotFit, or why the model could not be read) before any GPU is taken. While
the model's config.json is being read (an inspector pod, a hub that did not answer) the job
waits `Planned=False` with the reason, and nothing else is decided."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.status import PlanStatus
from ...api.strategy import Strategy
from ..decision import Effects, PlanFailed, PlanPending
from .phases import Inputs
from .status_builder import StatusBuilder


def plan(inputs: Inputs, b: StatusBuilder) -> PlanStatus | Effects:
    """The plan in force, or the effects of a job the planner refuses or cannot plan yet (nothing runs)."""
    current = b.status.plan
    if current is not None and b.status.observed_generation == inputs.job.metadata.generation:
        return current
    try:
        fresh = inputs.planner(inputs.job.spec)
    except PlanPending as exc:
        b.cond(ConditionType.PLANNED, False, exc.reason, str(exc))
        return inputs.stop(None, requeue_after=exc.retry_after)
    except PlanFailed as exc:
        b.cond(ConditionType.PLANNED, False, exc.reason, str(exc))
        b.fail(exc.reason, str(exc))
        return inputs.stop(None)
    if current is not None:
        fresh = fresh.model_copy(update={"replans": current.replans, "replan_reason": current.replan_reason})
    b.update(plan=fresh)
    strategy = str(Strategy.from_plan(fresh))
    message = fresh.reason if strategy in fresh.reason else f"{strategy}. {fresh.reason}".strip()
    b.cond(ConditionType.PLANNED, True, R.PLANNED, message)
    return fresh
