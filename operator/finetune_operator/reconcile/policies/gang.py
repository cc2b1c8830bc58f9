"""The gang verdict: which pods form the current gang, and how many of them are ready.

Pods created before the last failure or preemption belong to the gang that stopped: their
deletion did not happen or is in flight, so they are deleted (again) and not counted. The rest give the
workers' readiness, and rank 0's metrics the progress and its tracking report. When rank 0
first reports the checkpoint it resumed from, an Event says so, and whether it was converted
to the plan."""

from __future__ import annotations

from ...api import reasons as R
from ...api.status import PlanStatus, Progress, Workers
from ...api.strategy import Strategy
from ...api.timestamps import parse_timestamp
from . import tracking
from .phases import Cleared, Gang, Inputs
from .status_builder import StatusBuilder


def announce_resume(
    b: StatusBuilder, plan: PlanStatus, before: Progress | None, step: int | None, converted: bool
) -> None:
    """One Event when rank 0 first reports resuming from the step-`step` checkpoint."""
    if step is None or (before is not None and before.resumed_from_step == step):
        return
    how = "another strategy and converted" if converted else "the same strategy"
    b.event(
        R.RESUMED_CHECKPOINT,
        f"rank 0 resumed from the step-{step} checkpoint under {Strategy.from_plan(plan)}; it was written under {how}",
    )


def verdict(inputs: Inputs, b: StatusBuilder, cleared: Cleared) -> Gang:
    """The current gang; its readiness, progress and tracking report go into the status."""
    pods = inputs.observed.live_pods
    stops = [s.time for s in (b.status.last_failure, b.status.last_preemption) if s is not None and s.time]
    restarted_at = max((t for t in map(parse_timestamp, stops) if t is not None), default=None)
    old_gang = [p for p in pods if restarted_at and (parse_timestamp(p.created) or restarted_at) < restarted_at]
    if old_gang:
        pods = tuple(p for p in pods if p not in old_gang)
    ready = sum(1 for p in pods if p.ready and p.phase == "Running")
    b.update(workers=Workers(ready=ready, total=inputs.nodes, summary=f"{ready}/{inputs.nodes}"))
    progress = inputs.progress
    if progress is not None:
        before = b.status.progress
        if progress.checkpoint_save_seconds is None and before is not None:  # this gang has not saved yet
            progress = progress.model_copy(update={"checkpoint_save_seconds": before.checkpoint_save_seconds})
        plan = cleared.admission.plan
        announce_resume(b, plan, b.status.progress, progress.resumed_from_step, bool(progress.checkpoint_converted))
        b.update(progress=progress)
    tracking.record(inputs.tracking, b)
    return Gang(inputs, cleared, pods=pods, ready=ready, stale=bool(old_gang))
