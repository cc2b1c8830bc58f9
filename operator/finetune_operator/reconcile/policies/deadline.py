"""`activeDeadlineSeconds`: counted from when the job (last) started running, not from its
creation nor across a suspension; past it the job fails with DeadlineExceeded. Before it, the
pass asks to come back exactly when it passes."""

from __future__ import annotations

from datetime import timedelta

from ...api import reasons as R
from ...api.timestamps import parse_timestamp
from .context import Context, Decision


def decide(ctx: Context) -> Decision | None:
    b = ctx.status
    start = parse_timestamp(b.status.start_time)
    if start is None:
        b.update(start_time=b.now)
        start = ctx.now
    ctx.started = start
    deadline = ctx.job.spec.active_deadline_seconds
    if deadline is None:
        return None
    if ctx.now - start >= timedelta(seconds=deadline):
        b.fail(R.DEADLINE_EXCEEDED, f"running longer than activeDeadlineSeconds={deadline}")
        return ctx.stop()
    ctx.requeue_after = (start + timedelta(seconds=deadline) - ctx.now).total_seconds()
    return None
