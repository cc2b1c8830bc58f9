"""Finished jobs: nothing runs any more; the job is deleted `ttlSecondsAfterFinished` after it
finished. A job that failed before it started (InvalidSpec, DoesNotFit) and was edited since
is not finished: its failure is cleared so that the planning gate tries again."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.timestamps import parse_timestamp
from ..conditions import get, is_true
from ..decision import Effects
from .phases import Inputs
from .status_builder import StatusBuilder


def gate(inputs: Inputs, b: StatusBuilder) -> Effects | None:
    """The effects of a finished job (nothing runs; deleted once its TTL passed), or None."""
    conditions = b.status.conditions
    failed = get(conditions, ConditionType.FAILED)
    fixable = failed is not None and failed.reason in (R.INVALID_SPEC, R.DOES_NOT_FIT)
    if fixable and b.status.observed_generation != inputs.job.metadata.generation:
        b.update(conditions=[c for c in conditions if c.type != ConditionType.FAILED], completion_time=None)
        return None
    if not (is_true(conditions, ConditionType.SUCCEEDED) or is_true(conditions, ConditionType.FAILED)):
        return None
    finished = inputs.stop(b.status.plan)
    ttl = inputs.job.spec.ttl_seconds_after_finished
    done = parse_timestamp(b.status.completion_time)
    if ttl is None or done is None:
        return finished
    remaining = (done + timedelta(seconds=ttl) - inputs.now).total_seconds()
    if remaining > 0:
        return replace(finished, requeue_after=remaining)
    b.event(R.EXPIRED, f"deleted {ttl}s after it finished")
    return replace(finished, delete_job=True)
