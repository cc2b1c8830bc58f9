"""Serving the result (`spec.serving`): after success, the serving objects are applied once per
serving spec and result, and `status.serving` names them.

A pass on a Succeeded job renders them (`render.serving`); when what they follow (the serving
spec and the result's URIs, `status.serving.specHash`) changed since the last apply, the pass
applies them (`Effects.serve`) and records them. A target that cannot serve the result is the
`Serving` condition, False with the field and what would work, and an apply that fails is the
same condition, retried later (`runner`): neither ever fails the job, which succeeded.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from ...api import reasons as R
from ...api.job import FineTuneJob
from ...api.reasons import ConditionType
from ...render.serving.choice import Refused
from ...render.serving.objects import render_serving
from ..cluster_io import ChildWriteError
from ..conditions import get, is_true
from ..decision import Decision, Effects, Event
from .phases import Inputs
from .status_builder import StatusBuilder


def after_success(inputs: Inputs, b: StatusBuilder, finished: Effects) -> Effects:
    """`finished` (a finished job's effects), serving its result where the job asks for it."""
    spec = inputs.job.spec.serving
    if spec is None or not is_true(b.status.conditions, ConditionType.SUCCEEDED):
        return finished
    served = render_serving(inputs.job, b.status.result)
    if isinstance(served, Refused):
        before = get(b.status.conditions, ConditionType.SERVING)
        if before is None or before.reason != R.SERVING_REFUSED or before.message != str(served):
            b.event(R.SERVING_REFUSED, str(served), warn=True)
        b.cond(ConditionType.SERVING, False, R.SERVING_REFUSED, str(served))
        return finished
    applied = b.status.serving
    condition = get(b.status.conditions, ConditionType.SERVING)
    if applied is not None and applied.spec_hash == served.status.spec_hash and condition is not None:
        return finished  # applied (or its failure reported, and retried by the runner's requeue)
    b.update(serving=served.status)
    kinds = ", ".join(f"{o.kind} {o.name}" for o in served.status.objects)
    where = f" at {served.status.url}" if served.status.url else ""
    b.cond(
        ConditionType.SERVING,
        True,
        R.SERVING_APPLIED,
        f"{kinds} serve{'s' if len(served.objects) == 1 else ''} the {served.status.served} as "
        f"{served.status.model_name!r}{where}",
    )
    return replace(finished, serve=tuple(served.objects))


RETRY_SECONDS = 30.0
"""How soon a serving apply that failed is tried again."""


def not_applied(job: FineTuneJob, decision: Decision, error: ChildWriteError, now: datetime) -> Decision:
    """The pass's decision when its serving objects could not be applied: the `Serving`
    condition says why, `status.serving` is left as it was, and the apply is retried."""
    b = StatusBuilder(job.model_copy(update={"status": decision.status}), now)
    b.update(serving=job.status.serving if job.status is not None else None)
    before = get(job.status.conditions, ConditionType.SERVING) if job.status is not None else None
    message = str(error)
    b.cond(ConditionType.SERVING, False, R.SERVING_NOT_APPLIED, message)
    events = tuple(e for e in decision.events if e.reason != R.SERVING_APPLIED)
    if before is None or before.reason != R.SERVING_NOT_APPLIED or before.message != message:
        events = (*events, Event("Warning", R.SERVING_NOT_APPLIED, message))
    retry = RETRY_SECONDS if decision.requeue_after is None else min(decision.requeue_after, RETRY_SECONDS)
    return replace(decision, status=b.finish(), events=events, serve=(), requeue_after=retry)
