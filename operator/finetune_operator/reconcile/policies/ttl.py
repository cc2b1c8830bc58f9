"""Finished jobs: nothing runs any more; the job is deleted `ttlSecondsAfterFinished` after it
finished. A job that failed before it started (InvalidSpec, DoesNotFit) and was edited since
is not finished: its failure is cleared so that the planning policy tries again."""

from __future__ import annotations

from datetime import timedelta

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.timestamps import parse_timestamp
from ..conditions import get, is_true
from .context import Context, Decision, Event


def decide(ctx: Context) -> Decision | None:
    b = ctx.status
    conditions = b.status.conditions
    failed = get(conditions, ConditionType.FAILED)
    fixable = failed is not None and failed.reason in (R.INVALID_SPEC, R.DOES_NOT_FIT)
    if fixable and b.status.observed_generation != ctx.job.metadata.generation:
        b.update(conditions=[c for c in conditions if c.type != ConditionType.FAILED], completion_time=None)
        return None
    if not (is_true(conditions, ConditionType.SUCCEEDED) or is_true(conditions, ConditionType.FAILED)):
        return None
    decision = Decision(b.status, replicas=0, plan=b.status.plan)
    ttl = ctx.job.spec.ttl_seconds_after_finished
    done = parse_timestamp(b.status.completion_time)
    if ttl is not None and done is not None:
        remaining = (done + timedelta(seconds=ttl) - ctx.now).total_seconds()
        if remaining <= 0:
            decision.delete_job = True
            decision.events.append(Event("Normal", R.EXPIRED, f"deleted {ttl}s after it finished"))
        else:
            decision.requeue_after = remaining
    return decision
