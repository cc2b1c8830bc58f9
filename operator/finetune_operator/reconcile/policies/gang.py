"""The current gang of workers, which the worker policies decide on.

Pods created before the last failure belong to the gang that failed: their deletion did not
happen or is in flight, so they are deleted (again) and not counted. The rest give the
workers' readiness, and rank 0's metrics the progress."""

from __future__ import annotations

from ...api.status import Workers
from .context import Context, Decision, parse_timestamp


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
        b.update(progress=ctx.progress)
    ctx.pods, ctx.ready = pods, ready
    ctx.decision = Decision(
        b.status, replicas=ctx.nodes, plan=ctx.plan, delete_pods=bool(old_gang), requeue_after=ctx.requeue_after
    )
    return None
