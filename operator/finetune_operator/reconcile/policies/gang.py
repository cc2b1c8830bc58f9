"""The current gang of workers, which the worker policies decide on.

Pods created before the last failure belong to the gang that failed: their deletion did not
happen or is in flight, so they are deleted (again) and not counted. The rest give the
workers' readiness, and rank 0's metrics the progress. When rank 0 first reports the
checkpoint it resumed from, an Event says so, and whether it was converted to the plan."""

from __future__ import annotations

from ...api import reasons as R
from ...api.status import Progress, Workers
from ...api.timestamps import parse_timestamp
from .context import Context, Decision, StatusBuilder, describe_plan


def announce_resume(ctx: Context, b: StatusBuilder, before: Progress | None, step: int | None, converted: bool) -> None:
    """One Event when rank 0 first reports resuming from the step-`step` checkpoint."""
    if step is None or (before is not None and before.resumed_from_step == step):
        return
    plan = f" under {describe_plan(ctx.plan)}" if ctx.plan is not None else ""
    how = "another strategy and converted" if converted else "the same strategy"
    b.event(R.RESUMED_CHECKPOINT, f"rank 0 resumed from the step-{step} checkpoint{plan}; it was written under {how}")


def decide(ctx: Context) -> Decision | None:
    b = ctx.status
    pods = ctx.observed.live_pods
    failure = b.status.last_failure
    restarted_at = parse_timestamp(failure.time) if failure else None
    old_gang = [p for p in pods if restarted_at and (parse_timestamp(p.created) or restarted_at) < restarted_at]
    if old_gang:
        pods = tuple(p for p in pods if p not in old_gang)
    ready = sum(1 for p in pods if p.ready and p.phase == "Running")
    b.update(workers=Workers(ready=ready, total=ctx.nodes, summary=f"{ready}/{ctx.nodes}"))
    if ctx.progress is not None:
        announce_resume(
            ctx, b, b.status.progress, ctx.progress.resumed_from_step, bool(ctx.progress.checkpoint_converted)
        )
        b.update(progress=ctx.progress)
    ctx.pods, ctx.ready = pods, ready
    ctx.decision = Decision(
        b.status, replicas=ctx.nodes, plan=ctx.plan, delete_pods=bool(old_gang), requeue_after=ctx.requeue_after
    )
    return None
