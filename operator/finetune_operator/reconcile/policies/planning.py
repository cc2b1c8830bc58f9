"""The plan in force: planned once per generation of the spec. A re-plan after an out-of-memory
error survives a spec edit's new plan in its counters; a spec the planner refuses fails the
job (InvalidSpec, DoesNotFit) before any GPU is taken."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from .context import Context, Decision, PlanFailed, describe_plan


def decide(ctx: Context) -> Decision | None:
    b = ctx.status
    plan = b.status.plan
    if plan is None or b.status.observed_generation != ctx.job.metadata.generation:
        try:
            fresh = ctx.planner(ctx.job.spec)
        except PlanFailed as exc:
            b.cond(ConditionType.PLANNED, False, exc.reason, str(exc))
            b.fail(exc.reason, str(exc))
            return Decision(b.status, replicas=0, plan=None)
        if plan is not None:
            fresh = fresh.model_copy(update={"replans": plan.replans, "replan_reason": plan.replan_reason})
        plan = fresh
        b.update(plan=plan)
        b.cond(ConditionType.PLANNED, True, R.PLANNED, f"{describe_plan(plan)}. {plan.reason}".strip())
    ctx.plan = plan
    return None
