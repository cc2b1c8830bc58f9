"""A preemption: the ranks stopped on SIGTERM at a step boundary after saving a checkpoint.

A pod eviction, a node drain or a spot reclaim deletes one pod: its ranks are asked to stop, and
their peers in the other pods learn of it at the same step boundary, so every rank saves that
step and ends with `Preempted: ...` in its termination message (the trainer's `preemption`). That
is no failure: the gang restarts from the checkpoint, counted in `status.preemptions`, never in
`restarts` nor against `failurePolicy.backoffLimit`. A fingerprint of the stopped container run
counts each stop once, across operator restarts. Only a gang whose every failed pod says
`Preempted` is taken for preempted: a real failure among them is the failure policy's. A Kueue
eviction stops the gang before any pod reports, and is counted by `queueing`.
"""

from __future__ import annotations

from ...api import reasons as R
from ...api.reasons import ConditionType
from ...api.status import LastFailure
from .. import termination
from .phases import Action, Gang
from .status_builder import StatusBuilder


def decide(gang: Gang, b: StatusBuilder) -> Action | None:
    stopped = [(pod, term) for pod in gang.pods if (term := pod.failure) is not None]
    if not stopped or not all(termination.is_preempted(term) for _, term in stopped):
        return None
    pod, term = stopped[0]
    fingerprint = pod.fingerprint(term)
    last = b.status.last_preemption
    if last is None or last.fingerprint != fingerprint:
        cause = termination.root_cause(term, pod.name)
        count = b.status.preemptions + 1
        record = LastFailure(
            reason=R.PREEMPTED,
            message=cause,
            rank=pod.ordinal,
            exit_code=term.exit_code,
            time=b.now,
            fingerprint=fingerprint,
        )
        b.update(preemptions=count, last_preemption=record)
        message = (
            f"preemption {count}: the gang restarts from the checkpoint its ranks saved when asked to stop "
            f"(not a failure: restarts unchanged): {cause}"
        )
        b.cond(ConditionType.RESTARTING, True, R.PREEMPTED, message)
    b.cond(ConditionType.RUNNING, False, R.GANG_RESTART, "restarting all ranks together")
    return gang.restart(gang.plan)
