"""`activeDeadlineSeconds`: counted from when the job (last) started running, not from its
creation nor across a suspension; past it the job fails with DeadlineExceeded. Before it, the
pass asks to come back exactly when it passes."""

from __future__ import annotations

from datetime import timedelta

from ...api import reasons as R
from ...api.timestamps import parse_timestamp
from ..decision import Effects
from .phases import Admission, Cleared, Inputs
from .status_builder import StatusBuilder


def gate(inputs: Inputs, b: StatusBuilder, admission: Admission) -> Cleared | Effects:
    """The admitted job cleared to run (and when to look again), or the effects of failing it."""
    start = parse_timestamp(b.status.start_time)
    if start is None:
        b.update(start_time=b.now)
        start = inputs.now
    deadline = inputs.job.spec.active_deadline_seconds
    if deadline is None:
        return Cleared(admission, requeue_after=None)
    if inputs.now - start >= timedelta(seconds=deadline):
        b.fail(R.DEADLINE_EXCEEDED, f"running longer than activeDeadlineSeconds={deadline}")
        return inputs.stop(admission.plan, admission.placement)
    return Cleared(admission, requeue_after=(start + timedelta(seconds=deadline) - inputs.now).total_seconds())
