"""A child the operator could not write: a condition on the job, never a silent retry loop.

The reconciler's last step when applying a child (or creating the Kueue Workload) failed: it
amends the pass's decision before the status is written. Someone else's object of a
child's name (`ChildConflict`) and an apiserver that did not answer (`ChildWriteFailed`) keep
the job waiting, saying why, until the next pass finds the way clear. A child the apiserver
refuses as invalid (400, 413, 422) would be refused on every pass: the job fails with the
apiserver's message as `InvalidSpec`, which an edit of the spec clears (see `ttl`).
"""

from __future__ import annotations

from datetime import datetime

from ...api import reasons as R
from ...api.job import FineTuneJob
from ...api.reasons import ConditionType
from ..cluster_io import ChildWriteError
from ..conditions import get
from ..decision import Decision, Event
from .status_builder import StatusBuilder

INVALID_STATUSES = (400, 413, 422)


def amend(job: FineTuneJob, decision: Decision, error: ChildWriteError, now: datetime) -> Decision:
    """The pass's decision after `error`: its status says what blocked the write; nothing is
    deleted and no Workload is touched."""
    b = StatusBuilder(job.model_copy(update={"status": decision.status}), now)
    if error.status in INVALID_STATUSES:
        b.fail(R.INVALID_SPEC, f"the apiserver refused {error.kind} {error.name}: {error.message}")
        return Decision(replicas=0, plan=decision.plan, status=b.finish(), events=(*decision.events, *b.events))
    reason = R.CHILD_CONFLICT if error.conflict else R.CHILD_WRITE_FAILED
    message = str(error)
    before = get(decision.status.conditions, ConditionType.RUNNING)
    b.cond(ConditionType.RUNNING, False, reason, message)
    events = decision.events
    if before is None or before.reason != reason or before.message != message:
        events = (*events, Event("Warning", reason, message))
    return Decision(
        replicas=decision.replicas,
        plan=decision.plan,
        requeue_after=decision.requeue_after,
        status=b.finish(),
        events=events,
    )
