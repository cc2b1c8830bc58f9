"""The job lifecycle as one pure decision: job + observed children + clock → what to do.

`decide` never talks to the cluster. Its phases run in this order, each a module of
`policies/` taking the previous one's output (`policies/phases.py`): the gates (finished,
planning, suspension, Kueue admission, deadline), each of which may end the pass; the gang
verdict; the worker policies as functions of it (success, failure, config change, waiting);
the finish (the status built, its events, Kueue's wrap-up).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ..api.job import FineTuneJob
from ..api.status import PlanStatus, Progress
from .decision import Decision, Effects, Planner, Replanner
from .observed import Observed
from .policies import (
    config_change,
    deadline,
    failure,
    gang,
    planning,
    preemption,
    queueing,
    serving,
    success,
    suspend,
    ttl,
    waiting,
)
from .policies.finish import finish
from .policies.phases import Action, Cleared, Gang, Inputs, WorkerPolicy
from .policies.status_builder import StatusBuilder
from .tracking import TrackingReport

WORKER_POLICIES: tuple[WorkerPolicy, ...] = (success.decide, preemption.decide, failure.decide, config_change.decide)
"""Tried in order on the gang verdict; `waiting.decide` takes every gang they leave."""


def decide(job: FineTuneJob, observed: Observed, now: datetime, *, planner: Planner, replanner: Replanner,
           desired_config_hash: Callable[[PlanStatus], str], progress: Progress | None = None,
           default_queue: str | None = None, tracking_report: TrackingReport | None = None) -> Decision:  # fmt: skip
    """Everything the operator should do for this job now."""
    queue = job.spec.queue_name or default_queue
    inputs = Inputs(job, observed, now, planner, replanner, desired_config_hash, progress, tracking_report, queue)
    b = StatusBuilder(job, now)
    cleared = _gates(inputs, b)
    if not isinstance(cleared, Cleared):
        return finish(inputs, b, cleared)
    verdict = gang.verdict(inputs, b, cleared)
    return finish(inputs, b, verdict.effects(_act(verdict, b)))


def _gates(inputs: Inputs, b: StatusBuilder) -> Cleared | Effects:
    if (finished := ttl.gate(inputs, b)) is not None:
        return finished if finished.delete_job else serving.after_success(inputs, b, finished)
    if isinstance(plan := planning.plan(inputs, b), Effects):
        return plan
    if (suspended := suspend.gate(inputs, b, plan)) is not None:
        return suspended
    if isinstance(admission := queueing.admit(inputs, b, plan), Effects):
        return admission
    return deadline.gate(inputs, b, admission)


def _act(verdict: Gang, b: StatusBuilder) -> Action:
    for policy in WORKER_POLICIES:
        if (action := policy(verdict, b)) is not None:
            return action
    return waiting.decide(verdict, b)
