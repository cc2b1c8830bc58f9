"""The job lifecycle as one pure decision: job + observed children + clock → what to do.

`decide` never talks to the cluster. It runs the policies of `policies/` in order until one
decides, and returns the complete new status (written once by the caller, only if it
changed), the replicas and plan to render, whether to delete the whole gang of pods, whether
the TTL has expired, and the events of the transitions it made. Counters live in status, so
an operator restart loses nothing, and a failure is identified by a fingerprint so it is
counted exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ..api.job import FineTuneJob
from ..api.status import PlanStatus, Progress
from .observed import Observed
from .policies import (
    config_change,
    deadline,
    failure,
    gang,
    planning,
    queueing,
    success,
    suspend,
    tracking,
    ttl,
    waiting,
)
from .policies.context import (
    Context,
    Decision,
    Event,
    PlanFailed,
    Planner,
    PlanPending,
    Replanner,
    StatusBuilder,
    describe_plan,
)
from .tracking import TrackingReport

__all__ = [
    "POLICIES",
    "Decision",
    "Event",
    "PlanFailed",
    "PlanPending",
    "Planner",
    "Replanner",
    "decide",
    "describe_plan",
]

Policy = Callable[[Context], Decision | None]

POLICIES: tuple[Policy, ...] = (
    ttl.decide,  # finished: nothing runs; delete after the TTL
    planning.decide,  # the plan of this generation, or Failed/InvalidSpec|DoesNotFit
    suspend.decide,
    queueing.decide,  # under Kueue: nothing runs until the Workload is admitted; eviction scales to 0
    deadline.decide,
    gang.decide,  # the current gang's workers and progress; the decisions below refine it
    tracking.decide,  # rank 0's MLflow run into status.result.tracking; Events when publishing fails
    success.decide,
    failure.decide,  # gang restart, re-plan after an OOM, or Failed
    config_change.decide,
    waiting.decide,  # running or waiting: always decides
)


def decide(
    job: FineTuneJob,
    observed: Observed,
    now: datetime,
    *,
    planner: Planner,
    replanner: Replanner,
    desired_config_hash: Callable[[PlanStatus], str],
    progress: Progress | None = None,
    default_queue: str | None = None,
    tracking_report: TrackingReport | None = None,
) -> Decision:
    """Everything the operator should do for this job now."""
    builder = StatusBuilder(job, now)
    queue = job.spec.queue_name or default_queue
    ctx = Context(job, observed, now, planner, replanner, desired_config_hash, progress, builder, queue)
    ctx.tracking = tracking_report
    for policy in POLICIES:
        decision = policy(ctx)
        if decision is not None:
            decision.status = builder.finish()
            decision.events = [*builder.events, *decision.events]
            decision.placement = ctx.placement
            queueing.finish(ctx, decision)
            return decision
    raise AssertionError("the waiting policy decides every job that gets that far")
