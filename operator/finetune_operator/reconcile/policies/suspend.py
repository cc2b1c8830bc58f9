"""`spec.suspend`: scale the workers to 0 and keep the plan; resuming starts from the last
checkpoint and announces it."""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.status import Workers
from ..conditions import is_true
from .context import Context, Decision


def decide(ctx: Context) -> Decision | None:
    b = ctx.status
    if ctx.job.spec.suspend:
        b.cond(ConditionType.SUSPENDED, True, R.SUSPENDED, "spec.suspend is true: workers scaled to 0")
        b.cond(ConditionType.RUNNING, False, R.SUSPENDED, "")
        b.update(start_time=None, workers=Workers(ready=0, total=ctx.nodes, summary=f"0/{ctx.nodes}"))
        return ctx.stop()
    if is_true(b.status.conditions, ConditionType.SUSPENDED):
        b.cond(ConditionType.SUSPENDED, False, R.RESUMED, "resumed from the last checkpoint", announce=True)
    return None
