"""A worker runs an older configuration (a spec edit, a re-plan): restart every rank together
on the new one, from the last checkpoint (pods are never updated in place: `OnDelete`)."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from .context import Context, Decision


def decide(ctx: Context) -> Decision | None:
    if ctx.plan is None or not ctx.pods:
        return None
    desired = ctx.desired_config_hash(ctx.plan)
    if all(p.config_hash == desired for p in ctx.pods):
        return None
    b, decision = ctx.status, ctx.workers_decision
    decision.delete_pods = True
    b.cond(ConditionType.RESTARTING, True, R.CONFIG_CHANGED, "configuration changed: restarting all ranks")
    b.cond(ConditionType.RUNNING, False, R.CONFIG_CHANGED, "")
    return decision
